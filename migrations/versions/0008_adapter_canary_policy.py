"""Adapters: ``canary_policy`` (SPEC §16 canary analysis), a JSON object or null (unwatched).

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-01 13:30:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None
backward_compatible = True  # a nullable column: code of the previous release keeps working


def upgrade() -> None:
    # Plain ADD COLUMN on both dialects (nullable, no default): no table copy on SQLite.
    op.add_column("adapters", sa.Column("canary_policy", sa.JSON(), nullable=True))


def downgrade() -> None:
    # Plain DROP COLUMN (SQLite >= 3.35 and PostgreSQL): a batch copy of ``adapters`` would drop
    # a table that versions and grants reference, which SQLite's foreign keys refuse.
    op.drop_column("adapters", "canary_policy")
