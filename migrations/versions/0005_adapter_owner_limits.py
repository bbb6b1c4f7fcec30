"""Limits per adapter and per owner (SPEC §15): ``rpm``, ``tpm``, ``max_concurrency`` on
``adapters`` (shared by all tenants; null = unlimited) and the ``owners`` table (limits over all
adapters of one owner, keyed by the ``adapters.owner`` string).

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-01 12:30:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Nullable, no default: existing adapters read null (unlimited) on both dialects.
    with op.batch_alter_table("adapters", schema=None) as batch_op:
        batch_op.add_column(sa.Column("rpm", sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column("tpm", sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column("max_concurrency", sa.Integer(), nullable=True))
    op.create_table(
        "owners",
        sa.Column("name", sa.String(length=255), nullable=False),
        sa.Column("rpm", sa.Integer(), nullable=True),
        sa.Column("tpm", sa.Integer(), nullable=True),
        sa.Column("max_concurrency", sa.Integer(), nullable=True),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_owners")),
    )


def downgrade() -> None:
    op.drop_table("owners")
    # Plain DROP COLUMN (SQLite >= 3.35 and PostgreSQL): a batch copy of ``adapters`` would drop
    # a table that versions and grants reference, which SQLite's foreign keys refuse.
    for column in ("max_concurrency", "tpm", "rpm"):
        op.drop_column("adapters", column)
