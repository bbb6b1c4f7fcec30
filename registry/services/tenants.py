"""Tenants (limits merged key by key on update), API keys (shown once) and grants."""

from __future__ import annotations

import secrets
from typing import Any

from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from kit.errors import Conflict, InvalidRequest, NotFound
from registry import keys as keylib
from registry.models import ApiKeyRow, GrantRow, TenantRow, utcnow
from registry.repositories import tenants as repo
from registry.repositories.pagination import Page, clamp_limit, decode_cursor, page_of
from registry.services.adapters import adapter_row, require_slug
from registry.services.audit import record_change
from registry.services.records import GrantRecord, IssuedKey, KeyRecord, TenantRecord

# A tenant's limits: those of every level (``registry.services.limits``) and ``max_cold_waiters``
# (SPEC §15: requests of the tenant waiting for a cold load at once), which only tenants have.
LIMIT_KEYS = ("rpm", "tpm", "max_concurrency", "max_cold_waiters")
LIMIT_MAX = 2**31 - 1  # INTEGER columns on PostgreSQL


def _check_limits(limits: Any) -> dict[str, int | None]:
    """The limits a caller sent (any subset of :data:`LIMIT_KEYS`), checked; 422 otherwise."""
    if not isinstance(limits, dict):
        raise InvalidRequest("limits must be an object", details={"field": "limits"})
    out: dict[str, int | None] = {}
    for k, v in limits.items():
        if k not in LIMIT_KEYS:
            raise InvalidRequest(
                f"unknown limit {k!r} (known: {', '.join(LIMIT_KEYS)})", details={"field": k}
            )
        if v is not None and (not isinstance(v, int) or isinstance(v, bool) or not 0 <= v <= LIMIT_MAX):
            raise InvalidRequest(
                f"limit {k} must be an integer from 0 to {LIMIT_MAX}, or null", details={"field": k}
            )
        out[k] = v
    return out


def tenant_row(session: Session, tenant_id: str, *, for_update: bool = False) -> TenantRow:
    require_slug(tenant_id, "tenant_id")
    row = repo.get(session, tenant_id, for_update=for_update)
    if row is None:
        raise NotFound(f"tenant {tenant_id!r} not found", code="tenant_not_found")
    return row


def create_tenant(
    session: Session,
    *,
    tenant_id: str,
    name: str | None,
    limits: dict[str, Any] | None,
    base_model_access: bool,
    actor: str,
) -> TenantRecord:
    require_slug(tenant_id, "id")
    lim = _check_limits(limits or {})
    if repo.get(session, tenant_id) is not None:
        raise Conflict(f"tenant {tenant_id!r} already exists", code="tenant_exists")
    row = TenantRow(
        id=tenant_id,
        name=name or tenant_id,
        rpm=lim.get("rpm"),
        tpm=lim.get("tpm"),
        max_concurrency=lim.get("max_concurrency"),
        max_cold_waiters=lim.get("max_cold_waiters"),
        base_model_access=bool(base_model_access),
    )
    try:
        repo.add(session, row)
    except IntegrityError:
        raise Conflict(f"tenant {tenant_id!r} already exists", code="tenant_exists") from None
    record_change(
        session,
        actor=actor,
        action="tenant.created",
        subject_type="tenant",
        subject_id=tenant_id,
        details={"name": row.name, "limits": lim, "base_model_access": row.base_model_access},
    )
    return TenantRecord.of(row)


def describe_tenant(session: Session, tenant_id: str) -> TenantRecord:
    row = tenant_row(session, tenant_id)
    return TenantRecord.of(row, repo.grants_of(session, tenant_id), repo.keys_of(session, tenant_id))


def list_tenants(
    session: Session, *, limit: int | None = None, cursor: str | None = None, adapter_id: str | None = None
) -> Page[TenantRecord]:
    """Tenants by id; ``adapter_id``: only those granted that adapter."""
    n = clamp_limit(limit)
    rows = repo.list_rows(session, limit=n, after=decode_cursor(cursor, str), granted=adapter_id or None)
    items, nxt = page_of(rows, n, lambda r: r.id)
    return Page([TenantRecord.of(r) for r in items], nxt)


def update_tenant(session: Session, tenant_id: str, changes: dict[str, Any], *, actor: str) -> TenantRecord:
    """``changes`` holds only the fields the caller sent: ``name``, ``limits`` (merged key by key),
    ``base_model_access``."""
    row = tenant_row(session, tenant_id, for_update=True)
    applied: dict[str, Any] = {}
    if "name" in changes:
        if not isinstance(changes["name"], str) or not changes["name"]:
            raise InvalidRequest("name must be a non-empty string", details={"field": "name"})
        row.name = changes["name"]
        applied["name"] = row.name
    if "limits" in changes and changes["limits"] is not None:
        lim = _check_limits(dict(changes["limits"]))
        for k, v in lim.items():
            setattr(row, k, v)
        applied["limits"] = lim
    if "base_model_access" in changes:
        if not isinstance(changes["base_model_access"], bool):
            raise InvalidRequest(
                "base_model_access must be a boolean", details={"field": "base_model_access"}
            )
        row.base_model_access = changes["base_model_access"]
        applied["base_model_access"] = row.base_model_access
    repo.flush(session)
    if applied:
        record_change(
            session,
            actor=actor,
            action="tenant.updated",
            subject_type="tenant",
            subject_id=tenant_id,
            details=applied,
        )
    return TenantRecord.of(row)


def issue_key(session: Session, tenant_id: str, *, actor: str) -> IssuedKey:
    tenant_row(session, tenant_id)
    key = keylib.generate_key()
    row = ApiKeyRow(
        key_id="key_" + secrets.token_hex(8),
        tenant_id=tenant_id,
        prefix=keylib.key_prefix(key),
        key_hash=keylib.hash_key(key),
        created_at=utcnow(),
    )
    repo.add(session, row)
    record_change(
        session,
        actor=actor,
        action="key.issued",
        subject_type="tenant",
        subject_id=tenant_id,
        details={"key_id": row.key_id, "prefix": row.prefix},
    )
    return IssuedKey(key_id=row.key_id, key=key, prefix=row.prefix, created_at=row.created_at)


def revoke_key(session: Session, tenant_id: str, key_id: str, *, actor: str) -> KeyRecord:
    tenant_row(session, tenant_id)
    row = repo.get_key(session, key_id)
    if row is None or row.tenant_id != tenant_id:
        raise NotFound(f"key {key_id!r} of tenant {tenant_id!r} not found", code="key_not_found")
    if row.revoked_at is None:
        row.revoked_at = utcnow()
        repo.flush(session)
        record_change(
            session,
            actor=actor,
            action="key.revoked",
            subject_type="tenant",
            subject_id=tenant_id,
            details={"key_id": key_id, "prefix": row.prefix},
        )
    return KeyRecord.of(row)


def put_grant(
    session: Session, tenant_id: str, adapter_id: str, *, rpm: int | None, tpm: int | None, actor: str
) -> GrantRecord:
    tenant_row(session, tenant_id, for_update=True)
    adapter_row(session, adapter_id)
    lim = _check_limits({"rpm": rpm, "tpm": tpm})
    row = repo.get_grant(session, tenant_id, adapter_id)
    created = row is None
    if row is None:
        row = GrantRow(tenant_id=tenant_id, adapter_id=adapter_id, rpm=lim["rpm"], tpm=lim["tpm"])
        repo.add(session, row)
    else:
        row.rpm, row.tpm = lim["rpm"], lim["tpm"]
        repo.flush(session)
    record_change(
        session,
        actor=actor,
        action="grant.added",
        subject_type="tenant",
        subject_id=tenant_id,
        details={"adapter_id": adapter_id, "rpm": row.rpm, "tpm": row.tpm, "updated": not created},
    )
    return GrantRecord.of(row)


def delete_grant(session: Session, tenant_id: str, adapter_id: str, *, actor: str) -> GrantRecord:
    tenant_row(session, tenant_id, for_update=True)
    require_slug(adapter_id, "adapter_id")
    row = repo.get_grant(session, tenant_id, adapter_id)
    if row is None:
        raise NotFound(f"tenant {tenant_id!r} has no grant for {adapter_id!r}", code="grant_not_found")
    rec = GrantRecord.of(row)
    repo.delete_grant(session, row)
    record_change(
        session,
        actor=actor,
        action="grant.removed",
        subject_type="tenant",
        subject_id=tenant_id,
        details={"adapter_id": adapter_id},
    )
    return rec
