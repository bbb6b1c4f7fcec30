"""Adapters: ``on_load_failure`` (``error`` | ``previous_version`` | ``base_model``, SPEC §15).

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-01 12:30:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None
backward_compatible = True  # a column with a server default: older releases keep working


def upgrade() -> None:
    # NOT NULL with a server default: existing adapters keep today's behaviour ("error").
    with op.batch_alter_table("adapters", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("on_load_failure", sa.String(length=20), server_default="error", nullable=False)
        )


def downgrade() -> None:
    # Plain DROP COLUMN (SQLite >= 3.35 and PostgreSQL): a batch copy of ``adapters`` would drop
    # a table that versions and grants reference, which SQLite's foreign keys refuse.
    op.drop_column("adapters", "on_load_failure")
