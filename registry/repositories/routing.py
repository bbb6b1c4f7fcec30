"""The rows of a few routing subjects, for applying changes to a routing snapshot
(``registry.services.snapshot.apply_changes``): adapters with their versions, tenants with
their grants and live keys, base models — each by a list of ids, in chunked ``IN`` queries
through a session, or (PostgreSQL, ``subject_rows_pg``) all in one statement on an async
psycopg connection, which is what a gateway uses to apply a change in one round trip; and
(``all_rows_pg``, ``all_rows_pg_text``) every routing row in one statement, for a gateway's
whole reloads."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import psycopg
import sqlalchemy as sa
from sqlalchemy.orm import Session

from registry.models import AdapterRow, ApiKeyRow, BaseModelRow, GrantRow, TenantRow, VersionRow

CHUNK = 500  # ids per IN list (SQLite's bound-parameter limit is far above; plans stay simple)


def _chunks(ids: Sequence[str]) -> Iterator[list[str]]:
    for i in range(0, len(ids), CHUNK):
        yield list(ids[i : i + CHUNK])


def _rows(session: Session, query: Any, column: Any, ids: Sequence[str]) -> list[Any]:
    out: list[Any] = []
    for chunk in _chunks(sorted(set(ids))):
        out.extend(session.execute(query.where(column.in_(chunk))).scalars())
    return out


def adapters(session: Session, ids: Sequence[str]) -> list[AdapterRow]:
    return _rows(session, sa.select(AdapterRow), AdapterRow.id, ids)


def versions(session: Session, adapter_ids: Sequence[str]) -> list[VersionRow]:
    q = sa.select(VersionRow).order_by(VersionRow.adapter_id, VersionRow.number)
    return _rows(session, q, VersionRow.adapter_id, adapter_ids)


def base_models(session: Session, names: Sequence[str]) -> list[BaseModelRow]:
    return _rows(session, sa.select(BaseModelRow), BaseModelRow.name, names)


def tenants(session: Session, ids: Sequence[str]) -> list[TenantRow]:
    return _rows(session, sa.select(TenantRow), TenantRow.id, ids)


def grants(session: Session, tenant_ids: Sequence[str]) -> list[GrantRow]:
    q = sa.select(GrantRow).order_by(GrantRow.tenant_id, GrantRow.adapter_id)
    return _rows(session, q, GrantRow.tenant_id, tenant_ids)


def live_keys(session: Session, tenant_ids: Sequence[str]) -> list[ApiKeyRow]:
    q = sa.select(ApiKeyRow).where(ApiKeyRow.revoked_at.is_(None)).order_by(ApiKeyRow.key_id)
    return _rows(session, q, ApiKeyRow.tenant_id, tenant_ids)


# One statement for every changed subject's rows (PostgreSQL): a single statement sees one
# snapshot of the database, so no transaction (and no extra round trip) is needed.
SUBJECT_ROWS_PG = """
SELECT
  (SELECT revision FROM registry_state WHERE id = 1),
  (SELECT coalesce(json_agg(t), '[]') FROM base_models t WHERE name = ANY(%(base_models)s)),
  (SELECT coalesce(json_agg(t), '[]') FROM adapters t WHERE id = ANY(%(adapters)s)),
  (SELECT coalesce(json_agg(t ORDER BY adapter_id, number), '[]') FROM versions t
     WHERE adapter_id = ANY(%(adapters)s)),
  (SELECT coalesce(json_agg(t), '[]') FROM tenants t WHERE id = ANY(%(tenants)s)),
  (SELECT coalesce(json_agg(t ORDER BY tenant_id, adapter_id), '[]') FROM grants t
     WHERE tenant_id = ANY(%(tenants)s)),
  (SELECT coalesce(json_agg(t ORDER BY key_id), '[]') FROM api_keys t
     WHERE revoked_at IS NULL AND tenant_id = ANY(%(tenants)s)),
  (SELECT coalesce(json_agg(t), '[]') FROM owners t WHERE %(owners)s)
"""


@dataclass(frozen=True, slots=True)
class SubjectRows:
    """Rows of the changed subjects: ORM rows, or ``SimpleNamespace`` rows with the same attributes."""

    revision: int
    base_models: list[Any]
    adapters: list[Any]
    versions: list[Any]
    tenants: list[Any]
    grants: list[Any]
    live_keys: list[Any]
    owners: list[Any]  # every owner's row, read when any owner changed


async def subject_rows_pg(
    conn: psycopg.AsyncConnection[Any],
    *,
    adapters: Sequence[str],
    tenants: Sequence[str],
    base_models: Sequence[str],
    owners: bool,
) -> SubjectRows:
    """Every row ``apply_changes`` needs for these subjects, in one round trip."""
    params = {
        "adapters": list(adapters),
        "tenants": list(tenants),
        "base_models": list(base_models),
        "owners": owners,
    }
    cur = await conn.execute(SUBJECT_ROWS_PG, params)
    row = await cur.fetchone()
    assert row is not None
    rev, *tables = row
    ns = [[SimpleNamespace(**r) for r in t] for t in tables]
    return SubjectRows(int(rev or 0), *ns)


# The whole routing state in one statement (PostgreSQL): the rows of ``load_snapshot``'s queries.
ALL_ROWS_PG = """
SELECT
  (SELECT revision FROM registry_state WHERE id = 1),
  (SELECT coalesce(json_agg(t), '[]') FROM base_models t),
  (SELECT coalesce(json_agg(t), '[]') FROM adapters t),
  (SELECT coalesce(json_agg(t ORDER BY adapter_id, number), '[]') FROM versions t),
  (SELECT coalesce(json_agg(t), '[]') FROM tenants t),
  (SELECT coalesce(json_agg(t ORDER BY tenant_id, adapter_id), '[]') FROM grants t),
  (SELECT coalesce(json_agg(t ORDER BY key_id), '[]') FROM api_keys t WHERE revoked_at IS NULL),
  (SELECT coalesce(json_agg(t), '[]') FROM owners t)
"""


def all_rows_pg(conn: psycopg.Connection[Any]) -> SubjectRows:
    """Every routing row in one round trip (a single statement sees one snapshot)."""
    row = conn.execute(ALL_ROWS_PG).fetchone()
    assert row is not None
    rev, *tables = row
    return SubjectRows(int(rev or 0), *[[SimpleNamespace(**r) for r in t] for t in tables])


# ``ALL_ROWS_PG`` with every table as JSON text: nothing is parsed while the rows arrive, so a
# caller on an event loop can parse and build them in slices (``load_snapshot_pg_async``).
ALL_ROWS_PG_TEXT = ALL_ROWS_PG.replace("'[]')", "'[]')::text")
assert ALL_ROWS_PG_TEXT.count("::text") == 7


async def all_rows_pg_text(conn: psycopg.AsyncConnection[Any]) -> tuple[int, list[str]]:
    """The revision and every routing table as a JSON array in text, in one round trip."""
    cur = await conn.execute(ALL_ROWS_PG_TEXT)
    row = await cur.fetchone()
    assert row is not None
    rev, *tables = row
    return int(rev or 0), [str(t) for t in tables]
