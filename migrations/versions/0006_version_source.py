"""Where a version registered by reference came from (SPEC §15): ``source_uri`` (the normalised
``s3://`` / ``file://`` prefix or ``hf://ORG/REPO@REVISION[/SUBDIR]``) and ``source_revision``
(the commit sha an ``hf://`` revision resolved to at import). Both null for uploads and for
versions registered before this migration.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-01 13:00:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None
backward_compatible = True  # two nullable columns: code of the previous release keeps working


def upgrade() -> None:
    # Plain ADD COLUMN on both dialects (nullable, no default): no table copy on SQLite.
    op.add_column("versions", sa.Column("source_uri", sa.String(length=1024), nullable=True))
    op.add_column("versions", sa.Column("source_revision", sa.String(length=64), nullable=True))


def downgrade() -> None:
    # Plain DROP COLUMN (SQLite >= 3.35 and PostgreSQL): a batch copy of ``versions`` would drop a
    # table that other tables reference, which SQLite's foreign keys refuse.
    op.drop_column("versions", "source_revision")
    op.drop_column("versions", "source_uri")
