"""Tenants, API keys and grants."""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.orm import Session

from registry.models import ApiKeyRow, GrantRow, TenantRow
from registry.repositories.pagination import keyset_rows


def get(session: Session, tenant_id: str, *, for_update: bool = False) -> TenantRow | None:
    if not for_update or session.get_bind().dialect.name == "sqlite":
        return session.get(TenantRow, tenant_id)
    q = sa.select(TenantRow).where(TenantRow.id == tenant_id).with_for_update()
    return session.execute(q.execution_options(populate_existing=True)).scalar_one_or_none()


def add(session: Session, row: TenantRow | ApiKeyRow | GrantRow) -> None:
    session.add(row)
    session.flush()


def list_rows(
    session: Session, *, limit: int, after: str | None = None, granted: str | None = None
) -> list[TenantRow]:
    """A page of tenants by id; ``granted``: only those holding a grant for that adapter."""
    where = []
    if granted is not None:
        held = sa.select(GrantRow.tenant_id).where(GrantRow.adapter_id == granted)
        where.append(TenantRow.id.in_(held))
    return keyset_rows(session, TenantRow, TenantRow.id, limit=limit, after=after, where=where)


def all_rows(session: Session) -> list[TenantRow]:
    return list(session.execute(sa.select(TenantRow).order_by(TenantRow.id)).scalars())


# --------------------------------------------------------------------------- keys


def get_key(session: Session, key_id: str) -> ApiKeyRow | None:
    return session.get(ApiKeyRow, key_id)


def keys_of(session: Session, tenant_id: str) -> list[ApiKeyRow]:
    q = sa.select(ApiKeyRow).where(ApiKeyRow.tenant_id == tenant_id).order_by(ApiKeyRow.created_at)
    return list(session.execute(q).scalars())


def live_keys(session: Session) -> list[ApiKeyRow]:
    q = sa.select(ApiKeyRow).where(ApiKeyRow.revoked_at.is_(None)).order_by(ApiKeyRow.key_id)
    return list(session.execute(q).scalars())


# --------------------------------------------------------------------------- grants


def get_grant(session: Session, tenant_id: str, adapter_id: str) -> GrantRow | None:
    return session.get(GrantRow, (tenant_id, adapter_id))


def grants_of(session: Session, tenant_id: str) -> list[GrantRow]:
    q = sa.select(GrantRow).where(GrantRow.tenant_id == tenant_id).order_by(GrantRow.adapter_id)
    return list(session.execute(q).scalars())


def all_grants(session: Session) -> list[GrantRow]:
    return list(
        session.execute(sa.select(GrantRow).order_by(GrantRow.tenant_id, GrantRow.adapter_id)).scalars()
    )


def delete_grant(session: Session, row: GrantRow) -> None:
    session.delete(row)
    session.flush()


def flush(session: Session) -> None:
    session.flush()
