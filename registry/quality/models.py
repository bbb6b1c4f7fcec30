"""Tables of SPEC §16 (migration 0008). Rows never leave the ``registry`` package.

- ``regression_sets``: one row per stored version of an adapter's set (``version`` = max+1 per
  adapter), the normalised cases as JSON and their sha256 (canonical JSON: sorted keys, compact).
- ``quality_policies``: one row per adapter that has a ``quality_policy``.
- ``evaluations``: one row per run; ``status`` ``running`` → ``succeeded`` | ``failed``;
  ``done``/``total`` requests for the progress figure; ``worker`` and ``heartbeat_at`` say which
  process runs it and when it last reported (a stale heartbeat fails the run visibly);
  ``result`` holds the §16 result once finished.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Mapped, mapped_column

from kit.orm import Base
from registry.models import UTCDateTime, utcnow


class RegressionSetRow(Base):
    __tablename__ = "regression_sets"

    id: Mapped[int] = mapped_column(sa.Integer, primary_key=True, autoincrement=True)
    adapter_id: Mapped[str] = mapped_column(sa.ForeignKey("adapters.id"))
    version: Mapped[int] = mapped_column(sa.Integer)
    sha256: Mapped[str] = mapped_column(sa.String(64))
    cases: Mapped[list[dict[str, Any]]] = mapped_column(sa.JSON)
    created_by: Mapped[str] = mapped_column(sa.String(255))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)

    __table_args__ = (sa.UniqueConstraint("adapter_id", "version"),)


class QualityPolicyRow(Base):
    __tablename__ = "quality_policies"

    adapter_id: Mapped[str] = mapped_column(sa.ForeignKey("adapters.id"), primary_key=True)
    policy: Mapped[dict[str, Any]] = mapped_column(sa.JSON)
    updated_by: Mapped[str] = mapped_column(sa.String(255))
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)


class EvaluationRow(Base):
    __tablename__ = "evaluations"

    id: Mapped[str] = mapped_column(sa.String(64), primary_key=True)
    adapter_id: Mapped[str] = mapped_column(sa.ForeignKey("adapters.id"))
    version: Mapped[int] = mapped_column(sa.Integer)
    regression_set_version: Mapped[int] = mapped_column(sa.Integer)
    status: Mapped[str] = mapped_column(sa.String(16), default="running")
    done: Mapped[int] = mapped_column(sa.Integer, default=0)
    total: Mapped[int] = mapped_column(sa.Integer, default=0)
    verdict: Mapped[str | None] = mapped_column(sa.String(16), nullable=True)
    error: Mapped[str | None] = mapped_column(sa.Text, nullable=True)
    result: Mapped[dict[str, Any] | None] = mapped_column(sa.JSON, nullable=True)
    worker: Mapped[str | None] = mapped_column(sa.String(255), nullable=True)
    heartbeat_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    created_by: Mapped[str] = mapped_column(sa.String(255))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)

    __table_args__ = (
        sa.CheckConstraint("status IN ('running', 'succeeded', 'failed')", name="status"),
        sa.Index("ix_evaluations_adapter_version", "adapter_id", "version"),
        sa.Index("ix_evaluations_status", "status"),
    )
