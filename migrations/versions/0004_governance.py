"""Governance (SPEC §14): ``principals``, ``principal_tokens``, ``promotion_requests``, and
``approvals_required`` on base models (default 0) and adapters (null = the base model's).

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-01 12:00:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("base_models", schema=None) as batch_op:
        batch_op.add_column(sa.Column("approvals_required", sa.Integer(), server_default="0", nullable=False))
    with op.batch_alter_table("adapters", schema=None) as batch_op:
        batch_op.add_column(sa.Column("approvals_required", sa.Integer(), nullable=True))

    op.create_table(
        "principals",
        sa.Column("id", sa.String(length=64), nullable=False),
        sa.Column("role", sa.String(length=16), nullable=False),
        sa.Column("owners", sa.JSON(), nullable=False),
        sa.Column("created_by", sa.String(length=255), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint(
            "role IN ('viewer', 'maintainer', 'approver', 'operator', 'admin')",
            name=op.f("ck_principals_role"),
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_principals")),
    )
    op.create_table(
        "principal_tokens",
        sa.Column("token_id", sa.String(length=64), nullable=False),
        sa.Column("principal_id", sa.String(length=64), nullable=False),
        sa.Column("prefix", sa.String(length=32), nullable=False),
        sa.Column("token_hash", sa.String(length=128), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("revoked_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(
            ["principal_id"], ["principals.id"], name=op.f("fk_principal_tokens_principal_id_principals")
        ),
        sa.PrimaryKeyConstraint("token_id", name=op.f("pk_principal_tokens")),
    )
    with op.batch_alter_table("principal_tokens", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_principal_tokens_prefix"), ["prefix"], unique=False)
        batch_op.create_index(batch_op.f("ix_principal_tokens_principal_id"), ["principal_id"], unique=False)

    op.create_table(
        "promotion_requests",
        sa.Column("id", sa.String(length=64), nullable=False),
        sa.Column("adapter_id", sa.String(length=64), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("canary_weight", sa.Integer(), nullable=True),
        sa.Column("force", sa.Boolean(), server_default=sa.false(), nullable=False),
        sa.Column("requested_by", sa.String(length=255), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("approvals_required", sa.Integer(), nullable=False),
        sa.Column("approvals", sa.JSON(), nullable=False),
        sa.Column("seen_active_version", sa.Integer(), nullable=True),
        sa.Column("seen_canary_version", sa.Integer(), nullable=True),
        sa.Column("seen_version_status", sa.String(length=16), nullable=False),
        sa.Column("decided_by", sa.String(length=255), nullable=True),
        sa.Column("comment", sa.Text(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("decided_at", sa.DateTime(timezone=True), nullable=True),
        sa.CheckConstraint(
            "status IN ('pending', 'executed', 'rejected', 'expired', 'stale')",
            name=op.f("ck_promotion_requests_status"),
        ),
        sa.ForeignKeyConstraint(
            ["adapter_id"], ["adapters.id"], name=op.f("fk_promotion_requests_adapter_id_adapters")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_promotion_requests")),
    )
    with op.batch_alter_table("promotion_requests", schema=None) as batch_op:
        batch_op.create_index("ix_promotion_requests_adapter_status", ["adapter_id", "status"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("promotion_requests", schema=None) as batch_op:
        batch_op.drop_index("ix_promotion_requests_adapter_status")
    op.drop_table("promotion_requests")
    with op.batch_alter_table("principal_tokens", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_principal_tokens_principal_id"))
        batch_op.drop_index(batch_op.f("ix_principal_tokens_prefix"))
    op.drop_table("principal_tokens")
    op.drop_table("principals")
    # Plain DROP COLUMN (SQLite >= 3.35 and PostgreSQL): a batch copy of base_models / adapters
    # would drop tables that other rows reference, which SQLite's foreign keys refuse.
    op.drop_column("adapters", "approvals_required")
    op.drop_column("base_models", "approvals_required")
