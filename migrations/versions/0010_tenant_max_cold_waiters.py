"""Tenants: ``max_cold_waiters`` (SPEC §15), the most requests of the tenant that may wait for a
cold load at once; null = unlimited.

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-01 14:00:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None
backward_compatible = True  # a nullable column: code of the previous release keeps working


def upgrade() -> None:
    # Nullable, no default: existing tenants read null (unlimited) on both dialects.
    with op.batch_alter_table("tenants", schema=None) as batch_op:
        batch_op.add_column(sa.Column("max_cold_waiters", sa.Integer(), nullable=True))


def downgrade() -> None:
    # Plain DROP COLUMN (SQLite >= 3.35 and PostgreSQL): a batch copy of ``tenants`` would drop
    # a table that api_keys and grants reference, which SQLite's foreign keys refuse.
    op.drop_column("tenants", "max_cold_waiters")
