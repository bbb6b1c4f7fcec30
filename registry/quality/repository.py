"""All SQL of the quality tables (SPEC §16). Callers own the transaction; these only flush."""

from __future__ import annotations

from datetime import datetime

import sqlalchemy as sa
from sqlalchemy.orm import Session

from registry.quality.models import EvaluationRow, QualityPolicyRow, RegressionSetRow


def latest_set(session: Session, adapter_id: str) -> RegressionSetRow | None:
    q = (
        sa.select(RegressionSetRow)
        .where(RegressionSetRow.adapter_id == adapter_id)
        .order_by(RegressionSetRow.version.desc())
        .limit(1)
    )
    return session.scalars(q).first()


def get_set(session: Session, adapter_id: str, version: int) -> RegressionSetRow | None:
    q = sa.select(RegressionSetRow).where(
        RegressionSetRow.adapter_id == adapter_id, RegressionSetRow.version == version
    )
    return session.scalars(q).first()


def get_policy(session: Session, adapter_id: str) -> QualityPolicyRow | None:
    return session.get(QualityPolicyRow, adapter_id)


def get_evaluation(session: Session, eval_id: str, *, for_update: bool = False) -> EvaluationRow | None:
    return session.get(EvaluationRow, eval_id, with_for_update=for_update)


def running_for(session: Session, adapter_id: str, version: int) -> EvaluationRow | None:
    q = sa.select(EvaluationRow).where(
        EvaluationRow.adapter_id == adapter_id,
        EvaluationRow.version == version,
        EvaluationRow.status == "running",
    )
    return session.scalars(q).first()


def list_evaluations(
    session: Session, adapter_id: str, version: int | None, *, limit: int, before: str | None
) -> list[EvaluationRow]:
    """Newest first (ids sort by creation time), ``limit + 1`` rows after the cursor."""
    q = sa.select(EvaluationRow).where(EvaluationRow.adapter_id == adapter_id)
    if version is not None:
        q = q.where(EvaluationRow.version == version)
    if before is not None:
        q = q.where(EvaluationRow.id < before)
    return list(session.scalars(q.order_by(EvaluationRow.id.desc()).limit(limit + 1)))


def stale_running(session: Session, older_than: datetime) -> list[EvaluationRow]:
    q = (
        sa.select(EvaluationRow)
        .where(
            EvaluationRow.status == "running",
            sa.or_(EvaluationRow.heartbeat_at.is_(None), EvaluationRow.heartbeat_at < older_than),
        )
        .with_for_update(skip_locked=True)
    )
    return list(session.scalars(q))


def unclaimed(session: Session, limit: int) -> list[EvaluationRow]:
    q = (
        sa.select(EvaluationRow)
        .where(EvaluationRow.status == "running", EvaluationRow.worker.is_(None))
        .order_by(EvaluationRow.id)
        .limit(limit)
        .with_for_update(skip_locked=True)
    )
    return list(session.scalars(q))


def add(session: Session, row: RegressionSetRow | QualityPolicyRow | EvaluationRow) -> None:
    session.add(row)
    session.flush()


def flush(session: Session) -> None:
    session.flush()
