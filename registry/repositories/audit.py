"""Audit events: insert and list (filters ``action``, ``subject_type``, ``subject_id``, ``since``)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy.orm import Session

from registry.models import AuditEventRow, utcnow
from registry.repositories.pagination import keyset_rows


def add(
    session: Session, *, actor: str, action: str, subject_type: str, subject_id: str, details: dict[str, Any]
) -> AuditEventRow:
    row = AuditEventRow(
        ts=utcnow(),
        actor=actor,
        action=action,
        subject_type=subject_type,
        subject_id=subject_id,
        details=details,
    )
    session.add(row)
    session.flush()
    return row


def list_rows(
    session: Session,
    *,
    limit: int,
    after_id: int | None = None,
    action: str | None = None,
    subject_type: str | None = None,
    subject_id: str | None = None,
    since: datetime | None = None,
    newest_first: bool = False,
) -> list[AuditEventRow]:
    """Oldest first (chronological) or ``newest_first``, ``limit + 1`` rows so the caller knows if
    there are more."""
    filters = [
        (AuditEventRow.action, action),
        (AuditEventRow.subject_type, subject_type),
        (AuditEventRow.subject_id, subject_id),
    ]
    later = [AuditEventRow.ts >= since] if since is not None else []
    return keyset_rows(
        session, AuditEventRow, AuditEventRow.id, limit=limit, after=after_id, equal=filters, where=later,
        descending=newest_first,
    )  # fmt: skip
