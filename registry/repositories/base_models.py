"""Base models: get, add, list."""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.orm import Session

from registry.models import BaseModelRow
from registry.repositories.pagination import keyset_rows


def get(session: Session, name: str) -> BaseModelRow | None:
    return session.get(BaseModelRow, name)


def add(session: Session, row: BaseModelRow) -> BaseModelRow:
    session.add(row)
    session.flush()
    return row


def list_rows(session: Session, *, limit: int, after: str | None = None) -> list[BaseModelRow]:
    return keyset_rows(session, BaseModelRow, BaseModelRow.name, limit=limit, after=after)


def all_rows(session: Session) -> list[BaseModelRow]:
    return list(session.execute(sa.select(BaseModelRow).order_by(BaseModelRow.name)).scalars())
