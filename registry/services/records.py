"""Records returned by the services (SPEC §13 shapes), built from ORM rows inside the package."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from kit.ids import version_name
from registry.models import (
    AdapterRow,
    ApiKeyRow,
    AuditEventRow,
    BaseModelRow,
    GrantRow,
    TenantRow,
    VersionRow,
)


def vname(number: int | None) -> str | None:
    return version_name(number) if number is not None else None


@dataclass(frozen=True, slots=True)
class BaseModelRecord:
    name: str
    hf_id: str
    max_lora_rank: int
    target_modules: list[str]
    module_shapes: dict[str, list[int]] | None
    revision: str | None
    approvals_required: int
    created_at: datetime

    @classmethod
    def of(cls, row: BaseModelRow) -> BaseModelRecord:
        return cls(
            name=row.name,
            hf_id=row.hf_id,
            max_lora_rank=row.max_lora_rank,
            target_modules=list(row.target_modules),
            module_shapes={k: list(v) for k, v in row.module_shapes.items()} if row.module_shapes else None,
            revision=row.revision,
            approvals_required=int(row.approvals_required or 0),
            created_at=row.created_at,
        )


@dataclass(frozen=True, slots=True)
class FileRecord:
    name: str
    size: int
    sha256: str


@dataclass(frozen=True, slots=True)
class VersionRecord:
    adapter_id: str
    version: str
    status: str
    rank: int
    lora_alpha: float
    target_modules: list[str]
    files: list[FileRecord]
    storage_uri: str
    rollback_to: str | None
    quality_gate: str
    quality_gate_details: dict[str, Any] | None
    created_by: str
    created_at: datetime
    source_uri: str | None = None
    source_revision: str | None = None
    quality_gate_by: str | None = None

    @classmethod
    def of(cls, row: VersionRow) -> VersionRecord:
        return cls(
            adapter_id=row.adapter_id,
            version=version_name(row.number),
            status=row.status,
            rank=row.rank,
            lora_alpha=float(row.lora_alpha),
            target_modules=list(row.target_modules),
            files=[FileRecord(name=f["name"], size=int(f["size"]), sha256=f["sha256"]) for f in row.files],
            storage_uri=row.storage_uri,
            rollback_to=vname(row.rollback_to),
            quality_gate=row.quality_gate,
            quality_gate_details=(
                dict(row.quality_gate_details) if row.quality_gate_details is not None else None
            ),
            created_by=row.created_by,
            created_at=row.created_at,
            source_uri=row.source_uri,
            source_revision=row.source_revision,
            quality_gate_by=row.quality_gate_by,
        )


@dataclass(frozen=True, slots=True)
class LimitsRecord:
    rpm: int | None
    tpm: int | None
    max_concurrency: int | None


NO_LIMITS = LimitsRecord(rpm=None, tpm=None, max_concurrency=None)


@dataclass(frozen=True, slots=True)
class TenantLimitsRecord:
    """A tenant's limits: the three of every level, and ``max_cold_waiters`` (tenants only)."""

    rpm: int | None
    tpm: int | None
    max_concurrency: int | None
    max_cold_waiters: int | None


@dataclass(frozen=True, slots=True)
class AdapterRecord:
    id: str
    base_model: str
    owner: str | None
    description: str | None
    status: str
    active_version: str | None
    canary_version: str | None
    canary_weight: int | None
    hot: bool
    approvals_required: int | None
    created_at: datetime
    on_load_failure: str = "error"  # SPEC §15
    versions: list[VersionRecord] | None = None  # only in describe
    limits: LimitsRecord = NO_LIMITS  # shared by every tenant (SPEC §15)
    canary_policy: dict[str, Any] | None = None  # SPEC §16 canary analysis (None: unwatched)

    @classmethod
    def of(cls, row: AdapterRow, versions: list[VersionRow] | None = None) -> AdapterRecord:
        return cls(
            id=row.id,
            base_model=row.base_model,
            owner=row.owner,
            description=row.description,
            status=row.status,
            active_version=vname(row.active_version),
            canary_version=vname(row.canary_version),
            canary_weight=row.canary_weight if row.canary_version is not None else None,
            hot=bool(row.hot),
            on_load_failure=row.on_load_failure or "error",
            approvals_required=row.approvals_required,
            created_at=row.created_at,
            versions=[VersionRecord.of(v) for v in versions] if versions is not None else None,
            limits=LimitsRecord(rpm=row.rpm, tpm=row.tpm, max_concurrency=row.max_concurrency),
            canary_policy=dict(row.canary_policy) if row.canary_policy is not None else None,
        )


@dataclass(frozen=True, slots=True)
class OwnerRecord:
    owner: str
    limits: LimitsRecord
    adapters: list[str]  # ids of the adapters that name this owner
    updated_at: datetime | None  # when its limits were last set (None: never)


@dataclass(frozen=True, slots=True)
class GrantRecord:
    tenant_id: str
    adapter_id: str
    rpm: int | None
    tpm: int | None

    @classmethod
    def of(cls, row: GrantRow) -> GrantRecord:
        return cls(tenant_id=row.tenant_id, adapter_id=row.adapter_id, rpm=row.rpm, tpm=row.tpm)


@dataclass(frozen=True, slots=True)
class KeyRecord:
    """A key as listed: never the key itself."""

    key_id: str
    tenant_id: str
    prefix: str
    created_at: datetime
    revoked_at: datetime | None

    @classmethod
    def of(cls, row: ApiKeyRow) -> KeyRecord:
        return cls(
            key_id=row.key_id,
            tenant_id=row.tenant_id,
            prefix=row.prefix,
            created_at=row.created_at,
            revoked_at=row.revoked_at,
        )


@dataclass(frozen=True, slots=True)
class IssuedKey:
    """The one answer that ever carries the key."""

    key_id: str
    key: str
    prefix: str
    created_at: datetime


@dataclass(frozen=True, slots=True)
class TenantRecord:
    id: str
    name: str
    limits: TenantLimitsRecord
    base_model_access: bool
    created_at: datetime
    grants: list[GrantRecord] | None = None  # only in describe
    keys: list[KeyRecord] | None = None  # only in describe

    @classmethod
    def of(
        cls, row: TenantRow, grants: list[GrantRow] | None = None, keys: list[ApiKeyRow] | None = None
    ) -> TenantRecord:
        return cls(
            id=row.id,
            name=row.name,
            limits=TenantLimitsRecord(
                rpm=row.rpm,
                tpm=row.tpm,
                max_concurrency=row.max_concurrency,
                max_cold_waiters=row.max_cold_waiters,
            ),
            base_model_access=bool(row.base_model_access),
            created_at=row.created_at,
            grants=[GrantRecord.of(g) for g in grants] if grants is not None else None,
            keys=[KeyRecord.of(k) for k in keys] if keys is not None else None,
        )


@dataclass(frozen=True, slots=True)
class AuditRecord:
    id: int
    ts: datetime
    actor: str
    action: str
    subject_type: str
    subject_id: str
    details: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def of(cls, row: AuditEventRow) -> AuditRecord:
        return cls(
            id=row.id,
            ts=row.ts,
            actor=row.actor,
            action=row.action,
            subject_type=row.subject_type,
            subject_id=row.subject_id,
            details=dict(row.details or {}),
        )
