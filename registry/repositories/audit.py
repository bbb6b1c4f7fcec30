"""Audit events: insert and list (filters ``action``, ``subject_type``, ``subject_id``, ``since``)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Session

from registry.models import AuditEventRow, utcnow


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
) -> list[AuditEventRow]:
    """Oldest first (chronological), ``limit + 1`` rows so the caller knows if there are more."""
    q = sa.select(AuditEventRow).order_by(AuditEventRow.id).limit(limit + 1)
    if after_id is not None:
        q = q.where(AuditEventRow.id > after_id)
    if action:
        q = q.where(AuditEventRow.action == action)
    if subject_type:
        q = q.where(AuditEventRow.subject_type == subject_type)
    if subject_id:
        q = q.where(AuditEventRow.subject_id == subject_id)
    if since is not None:
        q = q.where(AuditEventRow.ts >= since)
    return list(session.execute(q).scalars())
