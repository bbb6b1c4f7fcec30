"""Promotion requests remember the version's quality gate when they were made
(``seen_quality_gate``: a gate changed since makes the request ``stale``, SPEC §19), and versions
remember who recorded their gate (``quality_gate_by``: separation of duties, README "Governance").
Both nullable: rows from before read null (a request made before this revision is not checked
against its gate; a gate recorded before it has no known setter).

Revision ID: 0011_gov_promotion_gate
Revises: 0010
Create Date: 2026-12-05 10:00:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0011_gov_promotion_gate"
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None
backward_compatible = True  # two nullable columns: code of the previous release keeps working


def upgrade() -> None:
    with op.batch_alter_table("promotion_requests", schema=None) as batch_op:
        batch_op.add_column(sa.Column("seen_quality_gate", sa.String(length=16), nullable=True))
    with op.batch_alter_table("versions", schema=None) as batch_op:
        batch_op.add_column(sa.Column("quality_gate_by", sa.String(length=255), nullable=True))


def downgrade() -> None:
    # Plain DROP COLUMN (SQLite >= 3.35 and PostgreSQL): a batch copy would drop tables that
    # others reference, which SQLite's foreign keys refuse.
    op.drop_column("versions", "quality_gate_by")
    op.drop_column("promotion_requests", "seen_quality_gate")
