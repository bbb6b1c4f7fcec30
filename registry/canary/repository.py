"""SQL of canary analysis: the watched canaries and when each began."""

from __future__ import annotations

from datetime import datetime

import sqlalchemy as sa
from sqlalchemy.orm import Session

from registry.models import AdapterRow, AuditEventRow


def watched(session: Session) -> list[AdapterRow]:
    """Enabled adapters with a canary and a canary policy, by id."""
    stmt = (
        sa.select(AdapterRow)
        .where(
            AdapterRow.canary_version.is_not(None),
            AdapterRow.canary_policy.is_not(None),
            AdapterRow.active_version.is_not(None),
            AdapterRow.status == "active",
        )
        .order_by(AdapterRow.id)
    )
    return list(session.scalars(stmt))


def canary_events(
    session: Session, adapter_id: str, limit: int = 5
) -> list[tuple[datetime, dict[str, object]]]:
    """The adapter's latest ``version.canary`` events (newest first): (time, details)."""
    stmt = (
        sa.select(AuditEventRow.ts, AuditEventRow.details)
        .where(
            AuditEventRow.action == "version.canary",
            AuditEventRow.subject_type == "adapter",
            AuditEventRow.subject_id == adapter_id,
        )
        .order_by(AuditEventRow.id.desc())
        .limit(limit)
    )
    return [(ts, dict(details or {})) for ts, details in session.execute(stmt)]
