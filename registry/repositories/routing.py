"""The rows of a few routing subjects, for applying changes to a routing snapshot
(``registry.services.snapshot.apply_changes``): adapters with their versions, tenants with
their grants and live keys, base models — each by a list of ids, in chunked ``IN`` queries."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

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
