"""Base models: get, add, list."""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.orm import Session

from registry.models import BaseModelRow


def get(session: Session, name: str) -> BaseModelRow | None:
    return session.get(BaseModelRow, name)


def add(session: Session, row: BaseModelRow) -> BaseModelRow:
    session.add(row)
    session.flush()
    return row


def list_rows(session: Session, *, limit: int, after: str | None = None) -> list[BaseModelRow]:
    q = sa.select(BaseModelRow).order_by(BaseModelRow.name).limit(limit + 1)
    if after is not None:
        q = q.where(BaseModelRow.name > after)
    return list(session.execute(q).scalars())


def all_rows(session: Session) -> list[BaseModelRow]:
    return list(session.execute(sa.select(BaseModelRow).order_by(BaseModelRow.name)).scalars())
