"""Audit: record a change (audit row + revision bump, in the caller's transaction), list events,
and ``DbAuditSink`` for the router's load/unload events (its own short transaction, off the loop).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import anyio.to_thread
from sqlalchemy.orm import Session, sessionmaker

from kit.db import session_scope
from kit.errors import InvalidRequest
from registry.repositories import audit as audit_repo
from registry.repositories import state as state_repo
from registry.repositories.pagination import Page, clamp_limit, decode_cursor, page_of
from registry.services.records import AuditRecord

# Every action name of SPEC §13 and §19, plus ``adapter.updated`` and ``version.quality_gate``.
ACTIONS = (
    "base_model.created",
    "adapter.created",
    "adapter.updated",  # not in SPEC §13: PATCH /adapters/{id} (owner, description, hot)
    "version.uploaded",
    "version.promoted",
    "version.canary",
    "version.quality_gate",  # not in SPEC §13: POST …/versions/{v}/quality-gate (from, to, details)
    "adapter.rolled_back",
    "adapter.disabled",
    "adapter.enabled",
    "version.disabled",
    "version.enabled",  # SPEC §19: POST …/versions/{v}/enable
    "version.canary_cleared",  # SPEC §19: DELETE /adapters/{id}/canary
    "tenant.created",
    "tenant.updated",
    "key.issued",
    "key.revoked",
    "grant.added",
    "grant.removed",
    "adapter.loaded",
    "adapter.unloaded",
    "adapter.load_failed",
    "adapter.hash_mismatch",
)
ORDERS = ("asc", "desc")
ROUTER_ACTIONS = ("adapter.loaded", "adapter.unloaded", "adapter.load_failed", "adapter.hash_mismatch")


def record_change(
    session: Session, *, actor: str, action: str, subject_type: str, subject_id: str, details: dict[str, Any]
) -> int:
    """Write the audit event of a state change and bump the registry revision; returns it.

    The change feed names ``subject_type:subject_id`` as what changed, so gateways reload just
    that record (``registry.services.snapshot.apply_changes``).
    """
    audit_repo.add(
        session, actor=actor, action=action, subject_type=subject_type, subject_id=subject_id, details=details
    )
    return state_repo.bump_revision(session, state_repo.subject(subject_type, subject_id))


def list_events(
    session: Session,
    *,
    limit: int | None = None,
    cursor: str | None = None,
    action: str | None = None,
    subject_type: str | None = None,
    subject_id: str | None = None,
    since: datetime | None = None,
    order: str = "asc",
) -> Page[AuditRecord]:
    """A page of events, oldest first (``order`` ``asc``, the default) or newest first (``desc``);
    a cursor continues in the order it was made in."""
    if order not in ORDERS:
        raise InvalidRequest(
            "order must be 'asc' (oldest first) or 'desc' (newest first)", details={"field": "order"}
        )
    n = clamp_limit(limit)
    rows = audit_repo.list_rows(
        session,
        limit=n,
        after_id=decode_cursor(cursor, int),
        action=action,
        subject_type=subject_type,
        subject_id=subject_id,
        since=since,
        newest_first=order == "desc",
    )
    items, nxt = page_of(rows, n, lambda r: r.id)
    return Page([AuditRecord.of(r) for r in items], nxt)


class DbAuditSink:
    """``registry.audit_sink.AuditSink`` on the registry database.

    Router events (``adapter.loaded`` …) use ``subject_type`` ``adapter`` and carry ``version``,
    ``replica``, ``duration_ms`` or ``reason`` in ``details``. They do not change routing state,
    so they do not bump the revision.
    """

    def __init__(self, session_factory: sessionmaker[Session]) -> None:
        self._factory = session_factory

    def _write(
        self, actor: str, action: str, subject_type: str, subject_id: str, details: dict[str, Any]
    ) -> None:
        with session_scope(self._factory) as session:
            audit_repo.add(
                session,
                actor=actor,
                action=action,
                subject_type=subject_type,
                subject_id=subject_id,
                details=dict(details),
            )

    async def record(
        self, *, actor: str, action: str, subject_type: str, subject_id: str, details: dict[str, Any]
    ) -> None:
        await anyio.to_thread.run_sync(self._write, actor, action, subject_type, subject_id, details)
