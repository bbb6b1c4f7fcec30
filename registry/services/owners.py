"""Owners (SPEC §15, the seed's "business"): limits over every adapter of one owner.

An owner is the ``owner`` string of its adapters; it exists as soon as an adapter names it, and
gets a row once limits are set (``PUT /owners/{owner}/limits``). Limits are shared by all the
owner's adapters and all tenants; the gateway checks them with the others in one admission.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from kit.errors import InvalidRequest, NotFound
from registry.models import OwnerRow, utcnow
from registry.repositories import owners as repo
from registry.services.audit import record_change
from registry.services.limits import LIMIT_KEYS, check_limits
from registry.services.records import LimitsRecord, OwnerRecord


def require_owner_name(owner: Any) -> str:
    """1 to 255 characters, no control characters (what ``adapters.owner`` may hold and match)."""
    if (
        not isinstance(owner, str)
        or not 1 <= len(owner) <= 255
        or any(ord(c) < 32 or ord(c) == 127 for c in owner)
    ):
        raise InvalidRequest(
            "owner must be 1 to 255 characters without control characters", details={"field": "owner"}
        )
    return owner


def _record(owner: str, row: OwnerRow | None, adapters: list[str]) -> OwnerRecord:
    limits = (
        LimitsRecord(rpm=row.rpm, tpm=row.tpm, max_concurrency=row.max_concurrency)
        if row is not None
        else LimitsRecord(rpm=None, tpm=None, max_concurrency=None)
    )
    return OwnerRecord(
        owner=owner, limits=limits, adapters=adapters, updated_at=row.updated_at if row is not None else None
    )


def describe_owner(session: Session, owner: str) -> OwnerRecord:
    """The owner's limits and adapters; 404 ``owner_not_found`` when no adapter names it and no
    limits were set for it."""
    require_owner_name(owner)
    row = repo.get(session, owner)
    adapters = repo.adapter_ids(session, owner)
    if row is None and not adapters:
        raise NotFound(
            f"owner {owner!r} not found (no adapter names it, no limits set)", code="owner_not_found"
        )
    return _record(owner, row, adapters)


def put_owner_limits(session: Session, owner: str, limits: dict[str, Any], *, actor: str) -> OwnerRecord:
    """Replace the owner's limits (a key left out is null: unlimited). A real change writes one
    ``owner.limits_updated`` audit event (``details``: the new limits) and bumps the revision;
    a call that changes nothing writes nothing."""
    require_owner_name(owner)
    lim = check_limits(limits)
    new = {k: lim.get(k) for k in LIMIT_KEYS}
    row = repo.get(session, owner, for_update=True)
    if row is None:
        try:
            with session.begin_nested():
                row = repo.add(session, OwnerRow(name=owner, updated_at=utcnow()))
        except IntegrityError:  # created by a concurrent call: take its row, locked
            row = repo.get(session, owner, for_update=True)
            assert row is not None
        changed = True
    else:
        changed = any(getattr(row, k) != v for k, v in new.items())
    if changed:
        for k, v in new.items():
            setattr(row, k, v)
        row.updated_at = utcnow()
        repo.flush(session)
        record_change(
            session,
            actor=actor,
            action="owner.limits_updated",
            subject_type="owner",
            subject_id=owner,
            details={"limits": new},
        )
    return _record(owner, row, repo.adapter_ids(session, owner))
