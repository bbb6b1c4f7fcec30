"""Owners (limits over all adapters of one owner) and the adapters that name an owner."""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.orm import Session

from registry.models import AdapterRow, OwnerRow


def get(session: Session, name: str, *, for_update: bool = False) -> OwnerRow | None:
    if not for_update:
        return session.get(OwnerRow, name)
    q = sa.select(OwnerRow).where(OwnerRow.name == name).execution_options(populate_existing=True)
    if session.get_bind().dialect.name != "sqlite":
        q = q.with_for_update()
    return session.execute(q).scalar_one_or_none()


def add(session: Session, row: OwnerRow) -> OwnerRow:
    session.add(row)
    session.flush()
    return row


def all_rows(session: Session) -> list[OwnerRow]:
    return list(session.execute(sa.select(OwnerRow).order_by(OwnerRow.name)).scalars())


def adapter_ids(session: Session, owner: str) -> list[str]:
    q = sa.select(AdapterRow.id).where(AdapterRow.owner == owner).order_by(AdapterRow.id)
    return list(session.execute(q).scalars())


def flush(session: Session) -> None:
    session.flush()
