"""ORM models of the registry (SQLAlchemy 2, sync). Rows never leave the ``registry`` package.

Governance (SPEC §14): ``principals`` (role, owners), ``principal_tokens`` (hash + prefix,
revocable), ``promotion_requests`` (approvals as a JSON list on the row, which approvers lock);
``approvals_required`` on base models and (overriding, nullable) on adapters.

Tables: ``base_models``, ``adapters`` (``hot``: marked hot by an operator, kept prewarmed by the
router, SPEC §8; ``rpm``/``tpm``/``max_concurrency`` shared by all tenants, SPEC §15), ``owners``
(limits over all adapters of one owner, SPEC §15), ``versions`` (``quality_gate`` with the
``quality_gate_details`` recorded with it, e.g. eval scores), ``tenants`` (``rpm``/``tpm``/
``max_concurrency``, and ``max_cold_waiters``, SPEC §15), ``api_keys``, ``grants``,
``audit_events`` and the single-row ``registry_state`` (``revision``, bumped by every change).

Version numbers and pointers (``active_version``, ``canary_version``, ``rollback_to``) are stored
as integers (``3``) and shown as ``"v3"``. The database itself guarantees that an adapter never
has two active (or two canary) versions: partial unique indexes on ``versions(adapter_id)``
``WHERE status = 'active'`` / ``'canary'`` (PostgreSQL and SQLite both support them).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Mapped, mapped_column, relationship

from kit.orm import Base


class UTCDateTime(sa.types.TypeDecorator[datetime]):
    """Timezone-aware UTC datetimes on both dialects (SQLite stores them naive)."""

    impl = sa.DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: sa.Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            value = value.replace(tzinfo=UTC)
        value = value.astimezone(UTC)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: datetime | None, dialect: sa.Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            return value.replace(tzinfo=UTC)
        return value.astimezone(UTC)


def utcnow() -> datetime:
    return datetime.now(UTC)


class BaseModelRow(Base):
    __tablename__ = "base_models"

    name: Mapped[str] = mapped_column(sa.String(64), primary_key=True)
    hf_id: Mapped[str] = mapped_column(sa.String(255))
    max_lora_rank: Mapped[int] = mapped_column(sa.Integer)
    target_modules: Mapped[list[str]] = mapped_column(sa.JSON)
    module_shapes: Mapped[dict[str, list[int]] | None] = mapped_column(sa.JSON, nullable=True)
    revision: Mapped[str | None] = mapped_column(sa.String(255), nullable=True)
    approvals_required: Mapped[int] = mapped_column(sa.Integer, default=0, server_default="0")
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)


class AdapterRow(Base):
    __tablename__ = "adapters"

    id: Mapped[str] = mapped_column(sa.String(64), primary_key=True)
    base_model: Mapped[str] = mapped_column(sa.ForeignKey("base_models.name"), index=True)
    owner: Mapped[str | None] = mapped_column(sa.String(255), nullable=True, index=True)
    description: Mapped[str | None] = mapped_column(sa.Text, nullable=True)
    status: Mapped[str] = mapped_column(sa.String(16), default="active")
    active_version: Mapped[int | None] = mapped_column(sa.Integer, nullable=True)
    canary_version: Mapped[int | None] = mapped_column(sa.Integer, nullable=True)
    canary_weight: Mapped[int | None] = mapped_column(sa.Integer, nullable=True)
    hot: Mapped[bool] = mapped_column(sa.Boolean, default=False, server_default=sa.false())
    # what the gateway serves when the selected version cannot be loaded (SPEC §15)
    on_load_failure: Mapped[str] = mapped_column(sa.String(20), default="error", server_default="error")
    # limits shared by every tenant of the adapter (SPEC §15); null = unlimited
    rpm: Mapped[int | None] = mapped_column(sa.Integer, nullable=True)
    tpm: Mapped[int | None] = mapped_column(sa.Integer, nullable=True)
    max_concurrency: Mapped[int | None] = mapped_column(sa.Integer, nullable=True)
    # null = the base model's approvals_required applies (SPEC §14)
    approvals_required: Mapped[int | None] = mapped_column(sa.Integer, nullable=True)
    # SPEC §16: watch canaries on live traffic (registry.canary.policy); null = unwatched
    canary_policy: Mapped[dict[str, Any] | None] = mapped_column(sa.JSON, nullable=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)

    versions: Mapped[list[VersionRow]] = relationship(
        back_populates="adapter", lazy="raise", order_by="VersionRow.number"
    )

    __table_args__ = (
        sa.CheckConstraint("status IN ('active', 'disabled')", name="status"),
        sa.CheckConstraint(
            "canary_weight IS NULL OR (canary_weight >= 1 AND canary_weight <= 99)", name="canary_weight"
        ),
    )


class VersionRow(Base):
    __tablename__ = "versions"

    id: Mapped[int] = mapped_column(sa.Integer, primary_key=True, autoincrement=True)
    adapter_id: Mapped[str] = mapped_column(sa.ForeignKey("adapters.id"))
    number: Mapped[int] = mapped_column(sa.Integer)
    status: Mapped[str] = mapped_column(sa.String(16), default="ready")
    rank: Mapped[int] = mapped_column(sa.Integer)
    lora_alpha: Mapped[float] = mapped_column(sa.Float)
    target_modules: Mapped[list[str]] = mapped_column(sa.JSON)
    files: Mapped[list[dict[str, Any]]] = mapped_column(sa.JSON)
    storage_uri: Mapped[str] = mapped_column(sa.String(1024))
    rollback_to: Mapped[int | None] = mapped_column(sa.Integer, nullable=True)
    quality_gate: Mapped[str] = mapped_column(sa.String(16), default="skipped")
    quality_gate_details: Mapped[dict[str, Any] | None] = mapped_column(sa.JSON, nullable=True)
    # who recorded the gate last (POST …/quality-gate or the evaluator); null: set at upload
    quality_gate_by: Mapped[str | None] = mapped_column(sa.String(255), nullable=True)
    created_by: Mapped[str] = mapped_column(sa.String(255))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    # registered by reference: where from, and (hf://) the commit the revision resolved to
    source_uri: Mapped[str | None] = mapped_column(sa.String(1024), nullable=True)
    source_revision: Mapped[str | None] = mapped_column(sa.String(64), nullable=True)

    adapter: Mapped[AdapterRow] = relationship(back_populates="versions", lazy="raise")

    __table_args__ = (
        sa.UniqueConstraint("adapter_id", "number"),
        sa.CheckConstraint("status IN ('ready', 'active', 'canary', 'retired', 'disabled')", name="status"),
        sa.CheckConstraint("quality_gate IN ('pending', 'passed', 'failed', 'skipped')", name="quality_gate"),
        sa.Index(
            "uq_versions_one_active",
            "adapter_id",
            unique=True,
            postgresql_where=sa.text("status = 'active'"),
            sqlite_where=sa.text("status = 'active'"),
        ),
        sa.Index(
            "uq_versions_one_canary",
            "adapter_id",
            unique=True,
            postgresql_where=sa.text("status = 'canary'"),
            sqlite_where=sa.text("status = 'canary'"),
        ),
    )


class OwnerRow(Base):
    """Limits over every adapter of one owner (SPEC §15; ``adapters.owner`` names it, no FK: an
    owner exists as soon as an adapter names it, a row only once limits are set)."""

    __tablename__ = "owners"

    name: Mapped[str] = mapped_column(sa.String(255), primary_key=True)
    rpm: Mapped[int | None] = mapped_column(sa.Integer, nullable=True)
    tpm: Mapped[int | None] = mapped_column(sa.Integer, nullable=True)
    max_concurrency: Mapped[int | None] = mapped_column(sa.Integer, nullable=True)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)


class TenantRow(Base):
    __tablename__ = "tenants"

    id: Mapped[str] = mapped_column(sa.String(64), primary_key=True)
    name: Mapped[str] = mapped_column(sa.String(255))
    rpm: Mapped[int | None] = mapped_column(sa.Integer, nullable=True)
    tpm: Mapped[int | None] = mapped_column(sa.Integer, nullable=True)
    max_concurrency: Mapped[int | None] = mapped_column(sa.Integer, nullable=True)
    # requests of the tenant waiting for a cold load at once, per gateway process (SPEC §15)
    max_cold_waiters: Mapped[int | None] = mapped_column(sa.Integer, nullable=True)
    base_model_access: Mapped[bool] = mapped_column(sa.Boolean, default=False)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)


class ApiKeyRow(Base):
    __tablename__ = "api_keys"

    key_id: Mapped[str] = mapped_column(sa.String(64), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(sa.ForeignKey("tenants.id"), index=True)
    prefix: Mapped[str] = mapped_column(sa.String(32), index=True)
    key_hash: Mapped[str] = mapped_column(sa.String(128))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    revoked_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)


class GrantRow(Base):
    __tablename__ = "grants"

    tenant_id: Mapped[str] = mapped_column(sa.ForeignKey("tenants.id"), primary_key=True)
    adapter_id: Mapped[str] = mapped_column(sa.ForeignKey("adapters.id"), primary_key=True)
    rpm: Mapped[int | None] = mapped_column(sa.Integer, nullable=True)
    tpm: Mapped[int | None] = mapped_column(sa.Integer, nullable=True)


class AuditEventRow(Base):
    __tablename__ = "audit_events"

    id: Mapped[int] = mapped_column(sa.Integer, primary_key=True, autoincrement=True)
    ts: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow, index=True)
    actor: Mapped[str] = mapped_column(sa.String(255))
    action: Mapped[str] = mapped_column(sa.String(64), index=True)
    subject_type: Mapped[str] = mapped_column(sa.String(32))
    subject_id: Mapped[str] = mapped_column(sa.String(255))
    details: Mapped[dict[str, Any]] = mapped_column(sa.JSON)

    __table_args__ = (sa.Index("ix_audit_events_subject", "subject_type", "subject_id"),)


class RegistryStateRow(Base):
    """One row (``id = 1``): the registry revision, bumped in the same transaction as every change."""

    __tablename__ = "registry_state"

    id: Mapped[int] = mapped_column(sa.Integer, primary_key=True, autoincrement=False)
    revision: Mapped[int] = mapped_column(sa.Integer, default=0)


class PrincipalRow(Base):
    """An admin caller: one role, and for scoped roles the adapter owners it may act on."""

    __tablename__ = "principals"

    id: Mapped[str] = mapped_column(sa.String(64), primary_key=True)
    role: Mapped[str] = mapped_column(sa.String(16))
    owners: Mapped[list[str]] = mapped_column(sa.JSON)
    created_by: Mapped[str] = mapped_column(sa.String(255))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)

    __table_args__ = (
        sa.CheckConstraint("role IN ('viewer', 'maintainer', 'approver', 'operator', 'admin')", name="role"),
    )


class PrincipalTokenRow(Base):
    __tablename__ = "principal_tokens"

    token_id: Mapped[str] = mapped_column(sa.String(64), primary_key=True)
    principal_id: Mapped[str] = mapped_column(sa.ForeignKey("principals.id"), index=True)
    prefix: Mapped[str] = mapped_column(sa.String(32), index=True)
    token_hash: Mapped[str] = mapped_column(sa.String(128))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    revoked_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)


class PromotionRequestRow(Base):
    """A promotion waiting for approvals. ``seen_*``: the adapter's state when it was requested
    (a change makes the request ``stale``). ``approvals``: ``[{"principal", "at"}]``."""

    __tablename__ = "promotion_requests"

    id: Mapped[str] = mapped_column(sa.String(64), primary_key=True)
    adapter_id: Mapped[str] = mapped_column(sa.ForeignKey("adapters.id"))
    version: Mapped[int] = mapped_column(sa.Integer)
    canary_weight: Mapped[int | None] = mapped_column(sa.Integer, nullable=True)
    force: Mapped[bool] = mapped_column(sa.Boolean, default=False, server_default=sa.false())
    requested_by: Mapped[str] = mapped_column(sa.String(255))
    status: Mapped[str] = mapped_column(sa.String(16), default="pending")
    approvals_required: Mapped[int] = mapped_column(sa.Integer)
    approvals: Mapped[list[dict[str, Any]]] = mapped_column(sa.JSON)
    seen_active_version: Mapped[int | None] = mapped_column(sa.Integer, nullable=True)
    seen_canary_version: Mapped[int | None] = mapped_column(sa.Integer, nullable=True)
    seen_version_status: Mapped[str] = mapped_column(sa.String(16))
    seen_quality_gate: Mapped[str | None] = mapped_column(sa.String(16), nullable=True)
    decided_by: Mapped[str | None] = mapped_column(sa.String(255), nullable=True)
    comment: Mapped[str | None] = mapped_column(sa.Text, nullable=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    expires_at: Mapped[datetime] = mapped_column(UTCDateTime())
    decided_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)

    __table_args__ = (
        sa.CheckConstraint(
            "status IN ('pending', 'executed', 'rejected', 'expired', 'stale')", name="status"
        ),
        sa.Index("ix_promotion_requests_adapter_status", "adapter_id", "status"),
    )
