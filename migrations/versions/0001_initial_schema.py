"""Initial schema: base models, adapters, versions, tenants, keys, grants, audit, registry state.

Revision ID: 0001
Revises:
Create Date: 2026-11-29 08:14:25.884645
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:

    op.create_table(
        "audit_events",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("ts", sa.DateTime(timezone=True), nullable=False),
        sa.Column("actor", sa.String(length=255), nullable=False),
        sa.Column("action", sa.String(length=64), nullable=False),
        sa.Column("subject_type", sa.String(length=32), nullable=False),
        sa.Column("subject_id", sa.String(length=255), nullable=False),
        sa.Column("details", sa.JSON(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_audit_events")),
    )
    with op.batch_alter_table("audit_events", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_audit_events_action"), ["action"], unique=False)
        batch_op.create_index("ix_audit_events_subject", ["subject_type", "subject_id"], unique=False)
        batch_op.create_index(batch_op.f("ix_audit_events_ts"), ["ts"], unique=False)

    op.create_table(
        "base_models",
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("hf_id", sa.String(length=255), nullable=False),
        sa.Column("max_lora_rank", sa.Integer(), nullable=False),
        sa.Column("target_modules", sa.JSON(), nullable=False),
        sa.Column("module_shapes", sa.JSON(), nullable=True),
        sa.Column("revision", sa.String(length=255), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_base_models")),
    )
    op.create_table(
        "registry_state",
        sa.Column("id", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("revision", sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_registry_state")),
    )
    op.create_table(
        "tenants",
        sa.Column("id", sa.String(length=64), nullable=False),
        sa.Column("name", sa.String(length=255), nullable=False),
        sa.Column("rpm", sa.Integer(), nullable=True),
        sa.Column("tpm", sa.Integer(), nullable=True),
        sa.Column("max_concurrency", sa.Integer(), nullable=True),
        sa.Column("base_model_access", sa.Boolean(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_tenants")),
    )
    op.create_table(
        "adapters",
        sa.Column("id", sa.String(length=64), nullable=False),
        sa.Column("base_model", sa.String(length=64), nullable=False),
        sa.Column("owner", sa.String(length=255), nullable=True),
        sa.Column("description", sa.Text(), nullable=True),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("active_version", sa.Integer(), nullable=True),
        sa.Column("canary_version", sa.Integer(), nullable=True),
        sa.Column("canary_weight", sa.Integer(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint("status IN ('active', 'disabled')", name=op.f("ck_adapters_status")),
        sa.CheckConstraint(
            "canary_weight IS NULL OR (canary_weight >= 1 AND canary_weight <= 99)",
            name=op.f("ck_adapters_canary_weight"),
        ),
        sa.ForeignKeyConstraint(
            ["base_model"], ["base_models.name"], name=op.f("fk_adapters_base_model_base_models")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_adapters")),
    )
    with op.batch_alter_table("adapters", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_adapters_base_model"), ["base_model"], unique=False)
        batch_op.create_index(batch_op.f("ix_adapters_owner"), ["owner"], unique=False)

    op.create_table(
        "api_keys",
        sa.Column("key_id", sa.String(length=64), nullable=False),
        sa.Column("tenant_id", sa.String(length=64), nullable=False),
        sa.Column("prefix", sa.String(length=32), nullable=False),
        sa.Column("key_hash", sa.String(length=128), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("revoked_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(["tenant_id"], ["tenants.id"], name=op.f("fk_api_keys_tenant_id_tenants")),
        sa.PrimaryKeyConstraint("key_id", name=op.f("pk_api_keys")),
    )
    with op.batch_alter_table("api_keys", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_api_keys_prefix"), ["prefix"], unique=False)
        batch_op.create_index(batch_op.f("ix_api_keys_tenant_id"), ["tenant_id"], unique=False)

    op.create_table(
        "grants",
        sa.Column("tenant_id", sa.String(length=64), nullable=False),
        sa.Column("adapter_id", sa.String(length=64), nullable=False),
        sa.Column("rpm", sa.Integer(), nullable=True),
        sa.Column("tpm", sa.Integer(), nullable=True),
        sa.ForeignKeyConstraint(["adapter_id"], ["adapters.id"], name=op.f("fk_grants_adapter_id_adapters")),
        sa.ForeignKeyConstraint(["tenant_id"], ["tenants.id"], name=op.f("fk_grants_tenant_id_tenants")),
        sa.PrimaryKeyConstraint("tenant_id", "adapter_id", name=op.f("pk_grants")),
    )
    op.create_table(
        "versions",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("adapter_id", sa.String(length=64), nullable=False),
        sa.Column("number", sa.Integer(), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("rank", sa.Integer(), nullable=False),
        sa.Column("lora_alpha", sa.Float(), nullable=False),
        sa.Column("target_modules", sa.JSON(), nullable=False),
        sa.Column("files", sa.JSON(), nullable=False),
        sa.Column("storage_uri", sa.String(length=1024), nullable=False),
        sa.Column("rollback_to", sa.Integer(), nullable=True),
        sa.Column("quality_gate", sa.String(length=16), nullable=False),
        sa.Column("created_by", sa.String(length=255), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint(
            "quality_gate IN ('pending', 'passed', 'failed', 'skipped')",
            name=op.f("ck_versions_quality_gate"),
        ),
        sa.CheckConstraint(
            "status IN ('ready', 'active', 'canary', 'retired', 'disabled')", name=op.f("ck_versions_status")
        ),
        sa.ForeignKeyConstraint(
            ["adapter_id"], ["adapters.id"], name=op.f("fk_versions_adapter_id_adapters")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_versions")),
        sa.UniqueConstraint("adapter_id", "number", name=op.f("uq_versions_adapter_id_number")),
    )
    with op.batch_alter_table("versions", schema=None) as batch_op:
        batch_op.create_index(
            "uq_versions_one_active",
            ["adapter_id"],
            unique=True,
            postgresql_where=sa.text("status = 'active'"),
            sqlite_where=sa.text("status = 'active'"),
        )
        batch_op.create_index(
            "uq_versions_one_canary",
            ["adapter_id"],
            unique=True,
            postgresql_where=sa.text("status = 'canary'"),
            sqlite_where=sa.text("status = 'canary'"),
        )

    registry_state = sa.table(
        "registry_state", sa.column("id", sa.Integer), sa.column("revision", sa.Integer)
    )
    op.bulk_insert(registry_state, [{"id": 1, "revision": 0}])


def downgrade() -> None:

    with op.batch_alter_table("versions", schema=None) as batch_op:
        batch_op.drop_index(
            "uq_versions_one_canary",
            postgresql_where=sa.text("status = 'canary'"),
            sqlite_where=sa.text("status = 'canary'"),
        )
        batch_op.drop_index(
            "uq_versions_one_active",
            postgresql_where=sa.text("status = 'active'"),
            sqlite_where=sa.text("status = 'active'"),
        )

    op.drop_table("versions")
    op.drop_table("grants")
    with op.batch_alter_table("api_keys", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_api_keys_tenant_id"))
        batch_op.drop_index(batch_op.f("ix_api_keys_prefix"))

    op.drop_table("api_keys")
    with op.batch_alter_table("adapters", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_adapters_owner"))
        batch_op.drop_index(batch_op.f("ix_adapters_base_model"))

    op.drop_table("adapters")
    op.drop_table("tenants")
    op.drop_table("registry_state")
    op.drop_table("base_models")
    with op.batch_alter_table("audit_events", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_audit_events_ts"))
        batch_op.drop_index("ix_audit_events_subject")
        batch_op.drop_index(batch_op.f("ix_audit_events_action"))

    op.drop_table("audit_events")
