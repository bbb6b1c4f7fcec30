"""Bulk rollback / disable / enable (SPEC §14).

A selector names the adapters: ``{"adapters": [ids]}`` (unknown ids answer ``adapter_not_found``
in their result), ``{"owner": …}``, ``{"base_model": …}`` or ``{"promoted_since": ISO 8601}``
(adapters with a promote or canary at or after that time, from the audit log). Exactly one key.

:func:`run` changes each adapter in its own transaction (``run_one``, given by the caller: the
admin API commits and publishes each, or rolls each back for ``dry_run``) with its own audit
event carrying ``details.bulk_id`` and ``details.reason``. A refusal of one (409
``no_rollback_target``, 404) is its result and does not stop the others.

Per result, ``from_version`` / ``to_version`` are the version served before / after (the
active version of an enabled adapter; null when the adapter is disabled or has none). A refused
change leaves the adapter as it was: both are the version it serves (read with ``read_one`` when
the caller gives it), so a dry run's table shows ``v1 (unchanged)`` rather than nothing.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, TypeVar

from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from kit.errors import InvalidRequest, LoraplaneError
from kit.inputs import utc_time
from registry.repositories import selection
from registry.services import lifecycle
from registry.services.adapters import adapter_row
from registry.services.records import AdapterRecord

ACTIONS = ("rollback", "disable", "enable")
SELECTOR_KEYS = ("adapters", "owner", "base_model", "promoted_since")
MAX_LISTED = 10_000

T = TypeVar("T")
Runner = Callable[[Callable[[Session], T]], T]


@dataclass(frozen=True, slots=True)
class Selector:
    kind: str
    adapters: tuple[str, ...] = ()
    value: str | None = None
    since: datetime | None = None


@dataclass(frozen=True, slots=True)
class BulkError:
    code: str
    message: str


@dataclass(frozen=True, slots=True)
class BulkItem:
    adapter_id: str
    ok: bool
    from_version: str | None
    to_version: str | None
    error: BulkError | None


@dataclass(frozen=True, slots=True)
class BulkResult:
    bulk_id: str
    dry_run: bool
    results: list[BulkItem]
    applied: int
    failed: int


def parse_selector(raw: Any) -> Selector:
    if not isinstance(raw, dict) or len(raw) != 1 or next(iter(raw)) not in SELECTOR_KEYS:
        raise InvalidRequest(
            "selector must be an object with exactly one of: adapters, owner, base_model, promoted_since",
            details={"field": "selector"},
        )
    kind, value = next(iter(raw.items()))
    if kind == "adapters":
        if (
            not isinstance(value, list)
            or not value
            or len(value) > MAX_LISTED
            or not all(isinstance(v, str) and v for v in value)
        ):
            raise InvalidRequest(
                f"selector.adapters must be a non-empty list of adapter ids (at most {MAX_LISTED})",
                details={"field": "selector.adapters"},
            )
        return Selector(kind, adapters=tuple(dict.fromkeys(value)))
    if not isinstance(value, str) or not value:
        raise InvalidRequest(
            f"selector.{kind} must be a non-empty string", details={"field": f"selector.{kind}"}
        )
    if kind == "promoted_since":
        try:
            since = utc_time(datetime.fromisoformat(value.replace("Z", "+00:00")))
        except ValueError:  # not ISO 8601, or out of range in UTC
            raise InvalidRequest(
                "selector.promoted_since must be an ISO 8601 time",
                details={"field": "selector.promoted_since"},
            ) from None
        return Selector(kind, since=since if since.tzinfo else since.replace(tzinfo=UTC))
    return Selector(kind, value=value)


def select(session: Session, sel: Selector) -> list[str]:
    """The adapter ids a selector names, in a stable order (listed ids as given)."""
    if sel.kind == "adapters":
        return list(sel.adapters)
    if sel.kind == "owner":
        return selection.ids_by_owner(session, sel.value or "")
    if sel.kind == "base_model":
        return selection.ids_by_base_model(session, sel.value or "")
    assert sel.since is not None
    return selection.ids_promoted_since(session, sel.since)


def _served(rec: AdapterRecord) -> str | None:
    return rec.active_version if rec.status == "active" else None


def apply_one(
    session: Session, action: str, adapter_id: str, *, actor: str, note: dict[str, Any]
) -> tuple[str | None, str | None]:
    """Change one adapter; ``(from_version, to_version)`` served before and after."""
    before = adapter_row(session, adapter_id, for_update=True)
    served_before = before.active_version if before.status == "active" else None
    if action == "rollback":
        rec = lifecycle.rollback(session, adapter_id, actor=actor, note=note)
    else:
        rec = lifecycle.set_adapter_enabled(session, adapter_id, action == "enable", actor=actor, note=note)
    return (f"v{served_before}" if served_before is not None else None, _served(rec))


def _change(
    action: str, adapter_id: str, actor: str, note: dict[str, Any]
) -> Callable[[Session], tuple[str | None, str | None]]:
    def change(session: Session) -> tuple[str | None, str | None]:
        return apply_one(session, action, adapter_id, actor=actor, note=note)

    return change


def _served_now(read_one: Runner[str | None] | None, adapter_id: str) -> str | None:
    """The version an adapter serves now (None when unknown, disabled or without one)."""
    if read_one is None:
        return None

    def served(session: Session) -> str | None:
        row = adapter_row(session, adapter_id)
        return f"v{row.active_version}" if row.status == "active" and row.active_version is not None else None

    try:
        return read_one(served)
    except LoraplaneError:
        return None


def run(
    action: str,
    adapter_ids: list[str],
    *,
    run_one: Runner[tuple[str | None, str | None]],
    actor: str,
    reason: str | None,
    dry_run: bool,
    read_one: Runner[str | None] | None = None,
) -> BulkResult:
    if action not in ACTIONS:
        raise InvalidRequest(f"unknown bulk action {action!r}")
    bulk_id = str(uuid.uuid4())
    note = {"bulk_id": bulk_id, "reason": reason}
    items: list[BulkItem] = []
    for adapter_id in adapter_ids:
        change = _change(action, adapter_id, actor, note)
        try:
            frm, to = run_one(change)
        except LoraplaneError as e:
            served = _served_now(read_one, adapter_id)
            items.append(BulkItem(adapter_id, False, served, served, BulkError(e.code, e.message)))
            continue
        except IntegrityError:
            msg = "the change conflicts with a concurrent one; retry"
            served = _served_now(read_one, adapter_id)
            items.append(BulkItem(adapter_id, False, served, served, BulkError("conflict", msg)))
            continue
        items.append(BulkItem(adapter_id, True, frm, to, None))
    ok = sum(1 for i in items if i.ok)
    return BulkResult(bulk_id=bulk_id, dry_run=dry_run, results=items, applied=ok, failed=len(items) - ok)
