"""Adapters and their versions: get (optionally ``FOR UPDATE``), add, list, next version number."""

from __future__ import annotations

from collections.abc import Iterable

import sqlalchemy as sa
from sqlalchemy.orm import Session

from registry.models import AdapterRow, VersionRow
from registry.repositories.pagination import keyset_rows


def get(session: Session, adapter_id: str, *, for_update: bool = False) -> AdapterRow | None:
    """The adapter row; with ``for_update`` the row is locked until commit (PostgreSQL).

    SQLite has no row locks; there every write transaction is ``BEGIN IMMEDIATE`` (kit.db), so
    writers are serialised anyway. ``populate_existing`` makes sure a locked read sees the
    committed state, not a stale identity-map copy.
    """
    if not for_update:
        return session.get(AdapterRow, adapter_id)
    q = sa.select(AdapterRow).where(AdapterRow.id == adapter_id).execution_options(populate_existing=True)
    if session.get_bind().dialect.name != "sqlite":
        q = q.with_for_update()
    return session.execute(q).scalar_one_or_none()


def exists(session: Session, adapter_id: str) -> bool:
    return session.execute(sa.select(AdapterRow.id).where(AdapterRow.id == adapter_id)).first() is not None


def add(session: Session, row: AdapterRow) -> AdapterRow:
    session.add(row)
    session.flush()
    return row


def list_rows(
    session: Session,
    *,
    limit: int,
    after: str | None = None,
    base_model: str | None = None,
    owner: str | None = None,
    status: str | None = None,
) -> list[AdapterRow]:
    filters = [(AdapterRow.base_model, base_model), (AdapterRow.owner, owner), (AdapterRow.status, status)]
    return keyset_rows(session, AdapterRow, AdapterRow.id, limit=limit, after=after, equal=filters)


def all_rows(session: Session) -> list[AdapterRow]:
    return list(session.execute(sa.select(AdapterRow).order_by(AdapterRow.id)).scalars())


# --------------------------------------------------------------------------- versions


def versions_of(session: Session, adapter_id: str) -> list[VersionRow]:
    q = (
        sa.select(VersionRow)
        .where(VersionRow.adapter_id == adapter_id)
        .order_by(VersionRow.number)
        .execution_options(populate_existing=True)
    )
    return list(session.execute(q).scalars())


def versions_of_many(session: Session, adapter_ids: Iterable[str]) -> dict[str, list[VersionRow]]:
    ids = list(adapter_ids)
    out: dict[str, list[VersionRow]] = {i: [] for i in ids}
    if not ids:
        return out
    q = (
        sa.select(VersionRow)
        .where(VersionRow.adapter_id.in_(ids))
        .order_by(VersionRow.adapter_id, VersionRow.number)
    )
    for row in session.execute(q).scalars():
        out[row.adapter_id].append(row)
    return out


def all_versions(session: Session) -> list[VersionRow]:
    q = sa.select(VersionRow).order_by(VersionRow.adapter_id, VersionRow.number)
    return list(session.execute(q).scalars())


def get_version(session: Session, adapter_id: str, number: int) -> VersionRow | None:
    q = sa.select(VersionRow).where(VersionRow.adapter_id == adapter_id, VersionRow.number == number)
    return session.execute(q).scalar_one_or_none()


def list_versions(
    session: Session, adapter_id: str, *, limit: int, after: int | None = None
) -> list[VersionRow]:
    of_adapter = [VersionRow.adapter_id == adapter_id]
    return keyset_rows(session, VersionRow, VersionRow.number, limit=limit, after=after, where=of_adapter)


def max_version_number(session: Session, adapter_id: str) -> int:
    q = sa.select(sa.func.max(VersionRow.number)).where(VersionRow.adapter_id == adapter_id)
    return int(session.execute(q).scalar() or 0)


def add_version(session: Session, row: VersionRow) -> VersionRow:
    session.add(row)
    session.flush()
    return row


def flush(session: Session) -> None:
    session.flush()
