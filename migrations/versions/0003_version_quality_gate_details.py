"""Versions: ``quality_gate_details`` (the JSON object recorded with a quality-gate result, e.g.
eval scores; null when none).

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-02 09:00:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Nullable, no default: existing versions read null (no details recorded) on both dialects.
    with op.batch_alter_table("versions", schema=None) as batch_op:
        batch_op.add_column(sa.Column("quality_gate_details", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("versions", schema=None) as batch_op:
        batch_op.drop_column("quality_gate_details")
