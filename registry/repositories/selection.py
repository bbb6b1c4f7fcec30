"""Which adapters a bulk selector names, and whose they are (owners for permission scopes)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

import sqlalchemy as sa
from sqlalchemy.orm import Session

from registry.models import AdapterRow, AuditEventRow, PromotionRequestRow

PROMOTION_ACTIONS = ("version.promoted", "version.canary")


def owner_of(session: Session, adapter_id: str) -> tuple[bool, str | None]:
    """``(exists, owner)`` of one adapter."""
    row = session.execute(sa.select(AdapterRow.owner).where(AdapterRow.id == adapter_id)).first()
    return (row is not None, row[0] if row is not None else None)


def owners_of(session: Session, adapter_ids: Sequence[str]) -> dict[str, str | None]:
    """Owner of each existing adapter among ``adapter_ids`` (unknown ids are left out)."""
    if not adapter_ids:
        return {}
    q = sa.select(AdapterRow.id, AdapterRow.owner).where(AdapterRow.id.in_(list(adapter_ids)))
    return {i: o for i, o in session.execute(q).all()}


def ids_by_owner(session: Session, owner: str) -> list[str]:
    q = sa.select(AdapterRow.id).where(AdapterRow.owner == owner).order_by(AdapterRow.id)
    return list(session.execute(q).scalars())


def ids_by_base_model(session: Session, base_model: str) -> list[str]:
    q = sa.select(AdapterRow.id).where(AdapterRow.base_model == base_model).order_by(AdapterRow.id)
    return list(session.execute(q).scalars())


def ids_promoted_since(session: Session, since: datetime) -> list[str]:
    """Adapters with a promote or canary (audit ``version.promoted`` / ``version.canary``) at or
    after ``since``."""
    q = (
        sa.select(AuditEventRow.subject_id)
        .where(
            AuditEventRow.action.in_(PROMOTION_ACTIONS),
            AuditEventRow.subject_type == "adapter",
            AuditEventRow.ts >= since,
        )
        .distinct()
    )
    return sorted(session.execute(q).scalars())


def owner_of_promotion(session: Session, promotion_id: str) -> tuple[bool, str | None]:
    """``(exists, owner of its adapter)`` of one promotion request."""
    q = (
        sa.select(AdapterRow.owner)
        .join(PromotionRequestRow, PromotionRequestRow.adapter_id == AdapterRow.id)
        .where(PromotionRequestRow.id == promotion_id)
    )
    row = session.execute(q).first()
    return (row is not None, row[0] if row is not None else None)
