"""Adapters: ``hot`` (marked hot by an operator; the router keeps it prewarmed, SPEC §8).

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-01 09:00:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # NOT NULL with a server default: existing rows become false on both dialects.
    with op.batch_alter_table("adapters", schema=None) as batch_op:
        batch_op.add_column(sa.Column("hot", sa.Boolean(), server_default=sa.false(), nullable=False))


def downgrade() -> None:
    with op.batch_alter_table("adapters", schema=None) as batch_op:
        batch_op.drop_column("hot")
