"""Promotion requests: get (optionally ``FOR UPDATE``), add, list with filters, pending of one
adapter. A request whose ``expires_at`` has passed while ``pending`` counts as ``expired`` in
the filters (it is written as such when someone next acts on it)."""

from __future__ import annotations

from datetime import datetime

import sqlalchemy as sa
from sqlalchemy.orm import Session

from registry.models import PromotionRequestRow
from registry.repositories.pagination import keyset_rows


def get(session: Session, promotion_id: str, *, for_update: bool = False) -> PromotionRequestRow | None:
    if not for_update:
        return session.get(PromotionRequestRow, promotion_id)
    q = (
        sa.select(PromotionRequestRow)
        .where(PromotionRequestRow.id == promotion_id)
        .execution_options(populate_existing=True)
    )
    if session.get_bind().dialect.name != "sqlite":
        q = q.with_for_update()
    return session.execute(q).scalar_one_or_none()


def add(session: Session, row: PromotionRequestRow) -> None:
    session.add(row)
    session.flush()


def _status_filter(status: str, now: datetime) -> sa.ColumnElement[bool]:
    pending = PromotionRequestRow.status == "pending"
    if status == "pending":
        return sa.and_(pending, PromotionRequestRow.expires_at > now)
    if status == "expired":
        return sa.or_(
            PromotionRequestRow.status == "expired", sa.and_(pending, PromotionRequestRow.expires_at <= now)
        )
    return PromotionRequestRow.status == status


def list_rows(
    session: Session,
    *,
    limit: int,
    now: datetime,
    after: str | None = None,
    status: str | None = None,
    adapter_id: str | None = None,
) -> list[PromotionRequestRow]:
    where = [_status_filter(status, now)] if status else []
    return keyset_rows(
        session,
        PromotionRequestRow,
        PromotionRequestRow.id,
        limit=limit,
        after=after,
        equal=[(PromotionRequestRow.adapter_id, adapter_id)],
        where=where,
    )


def pending_of(session: Session, adapter_id: str) -> list[PromotionRequestRow]:
    q = sa.select(PromotionRequestRow).where(
        PromotionRequestRow.adapter_id == adapter_id, PromotionRequestRow.status == "pending"
    )
    return list(session.execute(q).scalars())


def flush(session: Session) -> None:
    session.flush()
