"""Adapters: create, update (owner, description, hot, limits), describe (with versions), list with
filters; version listing and lookup."""

from __future__ import annotations

from typing import Any

from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from kit.errors import Conflict, InvalidRequest, NotFound
from kit.ids import is_slug, version_number
from registry.canary.policy import check_canary_policy
from registry.models import AdapterRow, VersionRow
from registry.repositories import adapters as repo
from registry.repositories import base_models as base_repo
from registry.repositories.pagination import Page, clamp_limit, decode_cursor, page_of
from registry.services.approvals import check_approvals_required
from registry.services.audit import record_change
from registry.services.limits import LIMIT_KEYS, check_limits
from registry.services.records import AdapterRecord, VersionRecord

ADAPTER_STATUSES = ("active", "disabled")


def require_slug(value: str, what: str) -> str:
    if not isinstance(value, str) or not is_slug(value):
        raise InvalidRequest(
            f"{what} must be a slug matching ^[a-z0-9][a-z0-9._-]{{0,62}}$ without '..'",
            details={"field": what, "value": value if isinstance(value, str) else None},
        )
    return value


def parse_version(value: str) -> int:
    n = version_number(value) if isinstance(value, str) else None
    if n is None:
        raise InvalidRequest("version must look like v1, v2, …", details={"field": "version", "value": value})
    return n


def adapter_row(session: Session, adapter_id: str, *, for_update: bool = False) -> AdapterRow:
    require_slug(adapter_id, "adapter_id")
    row = repo.get(session, adapter_id, for_update=for_update)
    if row is None:
        raise NotFound(f"adapter {adapter_id!r} not found", code="adapter_not_found")
    return row


def version_row(session: Session, adapter_id: str, version: str) -> VersionRow:
    n = parse_version(version)
    row = repo.get_version(session, adapter_id, n)
    if row is None:
        raise NotFound(f"version {version} of adapter {adapter_id!r} not found", code="version_not_found")
    return row


def create_adapter(
    session: Session,
    *,
    adapter_id: str,
    base_model: str,
    owner: str | None,
    description: str | None,
    actor: str,
    hot: bool = False,
    on_load_failure: str = "error",
) -> AdapterRecord:
    require_slug(adapter_id, "id")
    _check_field("hot", hot)
    _check_field("on_load_failure", on_load_failure)
    if base_repo.get(session, base_model) is None:
        raise InvalidRequest(f"base model {base_model!r} is not registered", details={"field": "base_model"})
    if repo.get(session, adapter_id) is not None:
        raise Conflict(f"adapter {adapter_id!r} already exists", code="adapter_exists")
    try:
        row = repo.add(
            session,
            AdapterRow(
                id=adapter_id,
                base_model=base_model,
                owner=owner,
                description=description,
                status="active",
                hot=hot,
                on_load_failure=on_load_failure,
            ),
        )
    except IntegrityError:
        raise Conflict(f"adapter {adapter_id!r} already exists", code="adapter_exists") from None
    record_change(
        session,
        actor=actor,
        action="adapter.created",
        subject_type="adapter",
        subject_id=adapter_id,
        details={"base_model": base_model, "owner": owner, "hot": hot, "on_load_failure": on_load_failure},
    )
    return AdapterRecord.of(row)


UPDATABLE = ("description", "owner", "hot", "approvals_required", "on_load_failure")
ON_LOAD_FAILURE = ("error", "previous_version", "base_model")


def _check_field(name: str, value: Any) -> None:
    if name == "approvals_required":
        check_approvals_required(value, nullable=True)
    elif name == "hot":
        if not isinstance(value, bool):
            raise InvalidRequest("hot must be a boolean", details={"field": "hot"})
    elif name == "on_load_failure":
        if value not in ON_LOAD_FAILURE:
            raise InvalidRequest(
                f"on_load_failure must be one of {', '.join(ON_LOAD_FAILURE)}", details={"field": name}
            )
    elif value is not None and not isinstance(value, str):
        raise InvalidRequest(f"{name} must be a string or null", details={"field": name})
    elif name == "owner" and value is not None and len(value) > 255:
        raise InvalidRequest("owner must be at most 255 characters", details={"field": "owner"})


def update_adapter(
    session: Session, adapter_id: str, changes: dict[str, Any], *, actor: str
) -> AdapterRecord:
    """``changes`` holds only the fields the caller sent (any of ``description``, ``owner``,
    ``hot``, ``limits``). The adapter row is locked first; fields whose value really changes are
    written, with one ``adapter.updated`` event (``details``: those fields, new values; for
    ``limits`` all three after the change) and a revision bump. A call that changes nothing
    writes nothing. ``limits`` is merged key by key (``{"rpm": 100}`` leaves ``tpm`` as it is);
    ``limits: null`` clears all three."""
    changes = dict(changes)
    limits = _limits_change(changes.pop("limits")) if "limits" in changes else None
    policy_sent = "canary_policy" in changes  # SPEC §16: stored whole, defaults filled in
    policy = check_canary_policy(changes.pop("canary_policy")) if policy_sent else None
    for name, value in changes.items():
        if name not in UPDATABLE:
            raise InvalidRequest(
                f"unknown field {name!r} (known: {', '.join((*UPDATABLE, 'limits', 'canary_policy'))})",
                details={"field": name},
            )
        _check_field(name, value)
    row = adapter_row(session, adapter_id, for_update=True)
    applied: dict[str, Any] = {}
    for name in UPDATABLE:
        if name in changes and getattr(row, name) != changes[name]:
            setattr(row, name, changes[name])
            applied[name] = changes[name]
    if limits is not None and any(getattr(row, k) != v for k, v in limits.items()):
        for k, v in limits.items():
            setattr(row, k, v)
        applied["limits"] = {k: getattr(row, k) for k in LIMIT_KEYS}
    if policy_sent and row.canary_policy != policy:
        row.canary_policy = policy
        applied["canary_policy"] = policy
    if applied:
        repo.flush(session)
        record_change(
            session,
            actor=actor,
            action="adapter.updated",
            subject_type="adapter",
            subject_id=adapter_id,
            details=applied,
        )
    return AdapterRecord.of(row)


def _limits_change(value: Any) -> dict[str, int | None]:
    if value is None:
        return dict.fromkeys(LIMIT_KEYS)
    return check_limits(value)


def describe_adapter(session: Session, adapter_id: str) -> AdapterRecord:
    row = adapter_row(session, adapter_id)
    return AdapterRecord.of(row, repo.versions_of(session, adapter_id))


def get_adapter(session: Session, adapter_id: str) -> AdapterRecord:
    return AdapterRecord.of(adapter_row(session, adapter_id))


def list_adapters(
    session: Session,
    *,
    limit: int | None = None,
    cursor: str | None = None,
    base_model: str | None = None,
    owner: str | None = None,
    status: str | None = None,
) -> Page[AdapterRecord]:
    if status is not None and status not in ADAPTER_STATUSES:
        raise InvalidRequest("status must be one of active, disabled", details={"field": "status"})
    n = clamp_limit(limit)
    rows = repo.list_rows(
        session, limit=n, after=decode_cursor(cursor, str), base_model=base_model, owner=owner, status=status
    )
    items, nxt = page_of(rows, n, lambda r: r.id)
    return Page([AdapterRecord.of(r) for r in items], nxt)


def list_versions(
    session: Session, adapter_id: str, *, limit: int | None = None, cursor: str | None = None
) -> Page[VersionRecord]:
    adapter_row(session, adapter_id)
    n = clamp_limit(limit)
    rows = repo.list_versions(session, adapter_id, limit=n, after=decode_cursor(cursor, int))
    items, nxt = page_of(rows, n, lambda r: r.number)
    return Page([VersionRecord.of(r) for r in items], nxt)


def get_version(session: Session, adapter_id: str, version: str) -> VersionRecord:
    adapter_row(session, adapter_id)
    return VersionRecord.of(version_row(session, adapter_id, version))
