"""Principals and their tokens."""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.orm import Session

from registry.models import PrincipalRow, PrincipalTokenRow
from registry.repositories.pagination import keyset_rows


def get(session: Session, principal_id: str, *, for_update: bool = False) -> PrincipalRow | None:
    if not for_update or session.get_bind().dialect.name == "sqlite":
        return session.get(PrincipalRow, principal_id)
    q = sa.select(PrincipalRow).where(PrincipalRow.id == principal_id).with_for_update()
    return session.execute(q.execution_options(populate_existing=True)).scalar_one_or_none()


def add(session: Session, row: PrincipalRow | PrincipalTokenRow) -> None:
    session.add(row)
    session.flush()


def list_rows(session: Session, *, limit: int, after: str | None = None) -> list[PrincipalRow]:
    return keyset_rows(session, PrincipalRow, PrincipalRow.id, limit=limit, after=after)


def get_token(session: Session, token_id: str) -> PrincipalTokenRow | None:
    return session.get(PrincipalTokenRow, token_id)


def tokens_of(session: Session, principal_id: str) -> list[PrincipalTokenRow]:
    q = (
        sa.select(PrincipalTokenRow)
        .where(PrincipalTokenRow.principal_id == principal_id)
        .order_by(PrincipalTokenRow.created_at, PrincipalTokenRow.token_id)
    )
    return list(session.execute(q).scalars())


def live_tokens_by_prefix(session: Session, prefix: str) -> list[tuple[PrincipalTokenRow, PrincipalRow]]:
    """Unrevoked tokens with this prefix, each with its principal (one query)."""
    q = (
        sa.select(PrincipalTokenRow, PrincipalRow)
        .join(PrincipalRow, PrincipalRow.id == PrincipalTokenRow.principal_id)
        .where(PrincipalTokenRow.prefix == prefix, PrincipalTokenRow.revoked_at.is_(None))
    )
    return [(t, p) for t, p in session.execute(q).all()]


def flush(session: Session) -> None:
    session.flush()
