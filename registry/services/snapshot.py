"""The routing snapshot (``registry.snapshot``) in one read transaction and a fixed number of
queries (no N+1): revision, base models, adapters, versions, tenants, grants, live keys.

On PostgreSQL the transaction is ``REPEATABLE READ`` when this function opens it, so every
query sees the same committed state; on SQLite every transaction is ``BEGIN IMMEDIATE``.
"""

from __future__ import annotations

from sqlalchemy.orm import Session

from kit.ids import version_name
from registry.repositories import adapters as adapter_repo
from registry.repositories import base_models as base_repo
from registry.repositories import state as state_repo
from registry.repositories import tenants as tenant_repo
from registry.snapshot import (
    AdapterInfo,
    BaseModelInfo,
    FileInfo,
    GrantInfo,
    KeyInfo,
    Limits,
    RoutingSnapshot,
    TenantInfo,
    VersionInfo,
)


def current_revision(session: Session) -> int:
    return state_repo.current_revision(session)


def load_snapshot(session: Session) -> RoutingSnapshot:
    if not session.in_transaction() and session.get_bind().dialect.name == "postgresql":
        session.connection(execution_options={"isolation_level": "REPEATABLE READ"})
    revision = state_repo.current_revision(session)

    base_models = {
        b.name: BaseModelInfo(
            name=b.name, hf_id=b.hf_id, max_lora_rank=b.max_lora_rank, target_modules=tuple(b.target_modules)
        )
        for b in base_repo.all_rows(session)
    }

    adapter_rows = adapter_repo.all_rows(session)
    base_of = {a.id: a.base_model for a in adapter_rows}
    versions: dict[str, dict[str, VersionInfo]] = {a.id: {} for a in adapter_rows}
    for v in adapter_repo.all_versions(session):
        name = version_name(v.number)
        versions.setdefault(v.adapter_id, {})[name] = VersionInfo(
            adapter_id=v.adapter_id,
            version=name,
            number=v.number,
            status=v.status,
            rank=v.rank,
            lora_alpha=float(v.lora_alpha),
            target_modules=tuple(v.target_modules),
            files=tuple(FileInfo(name=f["name"], size=int(f["size"]), sha256=f["sha256"]) for f in v.files),
            storage_uri=v.storage_uri,
            base_model=base_of.get(v.adapter_id, ""),
        )
    adapters = {
        a.id: AdapterInfo(
            id=a.id,
            base_model=a.base_model,
            status=a.status,
            active_version=version_name(a.active_version) if a.active_version is not None else None,
            canary_version=version_name(a.canary_version) if a.canary_version is not None else None,
            canary_weight=a.canary_weight if a.canary_version is not None else None,
            versions=versions.get(a.id, {}),
            hot=bool(a.hot),
        )
        for a in adapter_rows
    }

    grants: dict[str, dict[str, GrantInfo]] = {}
    for g in tenant_repo.all_grants(session):
        grants.setdefault(g.tenant_id, {})[g.adapter_id] = GrantInfo(
            adapter_id=g.adapter_id, rpm=g.rpm, tpm=g.tpm
        )
    tenants = {
        t.id: TenantInfo(
            id=t.id,
            name=t.name,
            limits=Limits(rpm=t.rpm, tpm=t.tpm, max_concurrency=t.max_concurrency),
            base_model_access=bool(t.base_model_access),
            grants=grants.get(t.id, {}),
        )
        for t in tenant_repo.all_rows(session)
    }

    by_prefix: dict[str, list[KeyInfo]] = {}
    for k in tenant_repo.live_keys(session):
        by_prefix.setdefault(k.prefix, []).append(
            KeyInfo(key_id=k.key_id, tenant_id=k.tenant_id, prefix=k.prefix, key_hash=k.key_hash)
        )
    return RoutingSnapshot(
        revision=revision,
        base_models=base_models,
        adapters=adapters,
        tenants=tenants,
        keys_by_prefix={p: tuple(ks) for p, ks in by_prefix.items()},
    )
