"""Quality services (SPEC §16): regression sets, quality policies, evaluation records and the
evaluator's tenant. Each function runs in the caller's transaction (it only flushes); every
change writes its audit event with :func:`registry.services.audit.record_change`.

Audit actions: ``regression_set.uploaded``, ``quality_policy.updated``, ``evaluation.started``
(actor: the caller), ``evaluation.succeeded`` / ``evaluation.failed`` (actor ``evaluator``) and,
through :func:`registry.services.gates.set_quality_gate`, ``version.quality_gate`` (actor
``evaluator``, ``details.details.evaluation_id``).

**The evaluator's tenant.** Evaluations go through the gateway like any client, so the evaluator
needs a tenant key: the tenant ``loraplane-evaluator`` (created on first use, base-model access,
no limits) gets a grant for the adapter under evaluation and one key per run, revoked when the
run ends (``key.issued`` / ``key.revoked`` events, actor ``evaluator``).
"""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from kit.errors import Conflict, InvalidRequest, NotFound
from kit.ids import version_name
from registry.models import utcnow
from registry.quality import repository as repo
from registry.quality.cases import parse_set
from registry.quality.models import EvaluationRow, QualityPolicyRow, RegressionSetRow
from registry.quality.results import DEFAULT_POLICY, effective_policy
from registry.repositories import tenants as tenants_repo
from registry.repositories.pagination import clamp_limit, decode_cursor, encode_cursor
from registry.services import tenants as tenant_svc
from registry.services.adapters import adapter_row, parse_version, version_row
from registry.services.audit import record_change
from registry.services.gates import set_quality_gate

EVALUATOR = "evaluator"
EVAL_TENANT = "loraplane-evaluator"
ERROR_MAX_CHARS = 2000


# --------------------------------------------------------------------------- regression sets


def _set_json(row: RegressionSetRow, *, with_cases: bool = True) -> dict[str, Any]:
    counts: dict[str, int] = {}
    for case in row.cases:
        for c in case.get("checks", []):
            counts[c["type"]] = counts.get(c["type"], 0) + 1
    out: dict[str, Any] = {
        "adapter_id": row.adapter_id,
        "version": row.version,
        "sha256": row.sha256,
        "case_count": len(row.cases),
        "check_counts": dict(sorted(counts.items())),
        "created_by": row.created_by,
        "created_at": row.created_at.isoformat(),
    }
    if with_cases:
        out["cases"] = row.cases
    return out


def put_regression_set(
    session: Session, adapter_id: str, body: bytes, *, actor: str
) -> tuple[dict[str, Any], bool]:
    """Validate and store a new version of the adapter's set; the same cases as the latest
    version (same sha256) store nothing. Returns the record and whether a version was added."""
    adapter_row(session, adapter_id, for_update=True)  # serialises versions of the set
    cases, digest = parse_set(body)
    latest = repo.latest_set(session, adapter_id)
    if latest is not None and latest.sha256 == digest:
        return _set_json(latest), False
    row = RegressionSetRow(
        adapter_id=adapter_id,
        version=(latest.version + 1) if latest is not None else 1,
        sha256=digest,
        cases=cases,
        created_by=actor,
        created_at=utcnow(),
    )
    repo.add(session, row)
    record_change(
        session,
        actor=actor,
        action="regression_set.uploaded",
        subject_type="adapter",
        subject_id=adapter_id,
        details={"regression_set_version": row.version, "sha256": digest, "cases": len(cases)},
    )
    return _set_json(row), True


def get_regression_set(session: Session, adapter_id: str, version: int | None = None) -> dict[str, Any]:
    adapter_row(session, adapter_id)
    row = (
        repo.latest_set(session, adapter_id)
        if version is None
        else repo.get_set(session, adapter_id, version)
    )
    if row is None:
        what = "no regression set" if version is None else f"no regression set version {version}"
        raise NotFound(f"adapter {adapter_id!r} has {what}", code="regression_set_not_found")
    return _set_json(row)


# --------------------------------------------------------------------------- quality policy


def check_policy(policy: Any) -> dict[str, float | None]:
    if not isinstance(policy, dict):
        raise InvalidRequest(
            "the quality policy must be a JSON object", details={"problems": ["not an object"]}
        )
    problems: list[str] = []
    extra = sorted(set(policy) - set(DEFAULT_POLICY))
    if extra:
        problems.append(f"unknown keys {extra} (known: {', '.join(DEFAULT_POLICY)})")
    out: dict[str, float | None] = {}
    for key in DEFAULT_POLICY:
        v = policy.get(key)
        if v is None:
            out[key] = None
            continue
        if (
            isinstance(v, bool)
            or not isinstance(v, int | float)
            or v != v
            or v in (float("inf"), float("-inf"))
        ):
            problems.append(f"{key} must be a number")
            continue
        if key == "max_regression_pp" and not 0 <= v <= 100:
            problems.append(f"{key} must be from 0 to 100 (percentage points)")
        elif key != "max_regression_pp" and not 0 <= v <= 1:
            problems.append(f"{key} must be from 0 to 1")
        else:
            out[key] = float(v)
    if problems:
        raise InvalidRequest("invalid quality policy: " + "; ".join(problems), details={"problems": problems})
    return out


def _policy_json(adapter_id: str, row: QualityPolicyRow | None) -> dict[str, Any]:
    return {
        "adapter_id": adapter_id,
        "quality_policy": row.policy if row is not None else None,
        "effective": effective_policy(row.policy if row is not None else None),
        "updated_by": row.updated_by if row is not None else None,
        "updated_at": row.updated_at.isoformat() if row is not None else None,
    }


def put_policy(session: Session, adapter_id: str, policy: Any, *, actor: str) -> dict[str, Any]:
    adapter_row(session, adapter_id, for_update=True)
    clean = check_policy(policy)
    row = repo.get_policy(session, adapter_id)
    before = row.policy if row is not None else None
    if row is None:
        row = QualityPolicyRow(adapter_id=adapter_id, policy=clean, updated_by=actor, updated_at=utcnow())
        repo.add(session, row)
    else:
        row.policy, row.updated_by, row.updated_at = clean, actor, utcnow()
        repo.flush(session)
    record_change(
        session,
        actor=actor,
        action="quality_policy.updated",
        subject_type="adapter",
        subject_id=adapter_id,
        details={"from": before, "to": clean},
    )
    return _policy_json(adapter_id, row)


def get_policy(session: Session, adapter_id: str) -> dict[str, Any]:
    adapter_row(session, adapter_id)
    return _policy_json(adapter_id, repo.get_policy(session, adapter_id))


# --------------------------------------------------------------------------- evaluations


def eval_json(row: EvaluationRow, *, with_result: bool = True) -> dict[str, Any]:
    out: dict[str, Any] = {
        "id": row.id,
        "adapter_id": row.adapter_id,
        "version": version_name(row.version),
        "status": row.status,
        "progress": {
            "done": row.done,
            "total": row.total,
            "fraction": round(row.done / row.total, 4) if row.total else 0.0,
        },
        "regression_set_version": row.regression_set_version,
        "verdict": row.verdict,
        "error": row.error,
        "created_by": row.created_by,
        "created_at": row.created_at.isoformat(),
        "finished_at": row.finished_at.isoformat() if row.finished_at else None,
    }
    if with_result:
        out["result"] = row.result
    return out


def _new_eval_id() -> str:
    return f"ev_{int(time.time() * 1000):012x}{secrets.token_hex(4)}"


def start_evaluation(
    session: Session, adapter_id: str, version: str, *, actor: str, worker: str | None
) -> dict[str, Any]:
    """The record of a new ``running`` evaluation. ``worker``: the process that runs it (it is
    handed over after the commit), or None for the next ``serve --role evaluator`` to claim."""
    adapter = adapter_row(session, adapter_id, for_update=True)
    vrow = version_row(session, adapter_id, version)
    if adapter.status == "disabled":
        raise Conflict(f"adapter {adapter_id!r} is disabled", code="adapter_disabled")
    if vrow.status == "disabled":
        raise Conflict(f"version {version_name(vrow.number)} is disabled", code="version_disabled")
    rset = repo.latest_set(session, adapter_id)
    if rset is None:
        raise Conflict(
            f"adapter {adapter_id!r} has no regression set: PUT /adapters/{adapter_id}/regression-set first",
            code="no_regression_set",
        )
    running = repo.running_for(session, adapter_id, vrow.number)
    if running is not None:
        raise Conflict(
            f"evaluation {running.id} of {version_name(vrow.number)} is still running",
            code="evaluation_running",
            details={"evaluation_id": running.id},
        )
    arms = 3 if adapter.active_version not in (None, vrow.number) else 2
    row = EvaluationRow(
        id=_new_eval_id(),
        adapter_id=adapter_id,
        version=vrow.number,
        regression_set_version=rset.version,
        status="running",
        done=0,
        total=arms * len(rset.cases),
        worker=worker,
        heartbeat_at=utcnow(),
        created_by=actor,
        created_at=utcnow(),
    )
    repo.add(session, row)
    record_change(
        session,
        actor=actor,
        action="evaluation.started",
        subject_type="adapter",
        subject_id=adapter_id,
        details={
            "evaluation_id": row.id,
            "version": version_name(row.version),
            "regression_set_version": rset.version,
        },
    )
    return eval_json(row)


def _eval_row(session: Session, adapter_id: str, eval_id: str, *, for_update: bool = False) -> EvaluationRow:
    row = repo.get_evaluation(session, eval_id, for_update=for_update)
    if row is None or row.adapter_id != adapter_id:
        raise NotFound(
            f"evaluation {eval_id!r} of adapter {adapter_id!r} not found", code="evaluation_not_found"
        )
    return row


def get_evaluation(session: Session, adapter_id: str, version: str, eval_id: str) -> dict[str, Any]:
    adapter_row(session, adapter_id)
    row = _eval_row(session, adapter_id, eval_id)
    if row.version != parse_version(version):
        raise NotFound(f"evaluation {eval_id!r} is not of version {version}", code="evaluation_not_found")
    return eval_json(row)


def list_evaluations(
    session: Session, adapter_id: str, version: str | None, *, limit: int | None, cursor: str | None
) -> dict[str, Any]:
    """Newest first, without ``result`` (read one evaluation for it)."""
    adapter_row(session, adapter_id)
    number = None
    if version is not None:
        number = version_row(session, adapter_id, version).number
    n = clamp_limit(limit)
    rows = repo.list_evaluations(session, adapter_id, number, limit=n, before=decode_cursor(cursor, str))
    page = rows[:n]
    nxt = encode_cursor(page[-1].id) if len(rows) > n and page else None
    return {"data": [eval_json(r, with_result=False) for r in page], "next_cursor": nxt}


@dataclass(frozen=True, slots=True)
class RunPlan:
    """What a run needs, read once at its start."""

    eval_id: str
    adapter_id: str
    version: int
    cases: list[dict[str, Any]]
    regression_set: dict[str, Any]
    models: dict[str, str | None]  # arm → served model name (None: the arm is not run)
    policy: dict[str, Any] | None


def plan_run(session: Session, eval_id: str) -> RunPlan:
    row = repo.get_evaluation(session, eval_id)
    if row is None:
        raise NotFound(f"evaluation {eval_id!r} not found", code="evaluation_not_found")
    adapter = adapter_row(session, row.adapter_id)
    rset = repo.get_set(session, row.adapter_id, row.regression_set_version)
    if rset is None:
        raise NotFound(
            f"regression set {row.regression_set_version} is gone", code="regression_set_not_found"
        )
    base, aid = adapter.base_model, adapter.id
    current = adapter.active_version
    models: dict[str, str | None] = {
        "base": base,
        "current": f"{base}:{aid}@{version_name(current)}" if current not in (None, row.version) else None,
        "candidate": f"{base}:{aid}@{version_name(row.version)}",
    }
    policy_row = repo.get_policy(session, aid)
    return RunPlan(
        eval_id=row.id,
        adapter_id=aid,
        version=row.version,
        cases=list(rset.cases),
        regression_set={"version": rset.version, "sha256": rset.sha256},
        models=models,
        policy=policy_row.policy if policy_row is not None else None,
    )


def issue_eval_key(session: Session, adapter_id: str) -> tuple[str, str]:
    """(key_id, key) of a fresh key of the evaluator's tenant, with a grant for the adapter."""
    # Runs start concurrently (several evaluator processes, or two runs in one): whoever loses
    # the race to create the tenant or the grant rolls back its savepoint and uses the winner's.
    if tenants_repo.get(session, EVAL_TENANT) is None:
        try:
            with session.begin_nested():
                tenant_svc.create_tenant(
                    session, tenant_id=EVAL_TENANT, name="loraplane evaluator (internal)", limits=None,
                    base_model_access=True, actor=EVALUATOR,
                )  # fmt: skip
        except (Conflict, IntegrityError):
            pass
    if tenants_repo.get_grant(session, EVAL_TENANT, adapter_id) is None:
        try:
            with session.begin_nested():
                tenant_svc.put_grant(session, EVAL_TENANT, adapter_id, rpm=None, tpm=None, actor=EVALUATOR)
        except IntegrityError:
            pass
    issued = tenant_svc.issue_key(session, EVAL_TENANT, actor=EVALUATOR)
    return issued.key_id, issued.key


def revoke_eval_key(session: Session, key_id: str) -> None:
    tenant_svc.revoke_key(session, EVAL_TENANT, key_id, actor=EVALUATOR)


def report_progress(session: Session, eval_id: str, done: int) -> bool:
    """Record progress and the heartbeat; False when the run is no longer ``running`` (a sweeper
    failed it), so the runner stops."""
    row = repo.get_evaluation(session, eval_id, for_update=True)
    if row is None or row.status != "running":
        return False
    row.done, row.heartbeat_at = done, utcnow()
    repo.flush(session)
    return True


def finish(session: Session, eval_id: str, result: dict[str, Any]) -> dict[str, Any]:
    """Store the result, set the version's quality gate from the verdict (actor ``evaluator``)."""
    row = repo.get_evaluation(session, eval_id, for_update=True)
    if row is None or row.status != "running":
        raise Conflict(f"evaluation {eval_id!r} is no longer running", code="evaluation_not_running")
    verdict = result["verdict"]
    row.status, row.result, row.verdict = "succeeded", result, verdict["gate"]
    row.done, row.finished_at, row.heartbeat_at = row.total, utcnow(), utcnow()
    repo.flush(session)
    cand = result["arms"]["candidate"]
    gate_details = {
        "evaluation_id": eval_id,
        "pass_rate": cand["pass_rate"],
        "format_error_rate": cand["format_error_rate"],
        "regression_pp": verdict["regression_pp"],
        "reasons": verdict["reasons"],
    }
    set_quality_gate(
        session, row.adapter_id, version_name(row.version), verdict["gate"], gate_details, actor=EVALUATOR
    )
    record_change(
        session,
        actor=EVALUATOR,
        action="evaluation.succeeded",
        subject_type="adapter",
        subject_id=row.adapter_id,
        details={"evaluation_id": eval_id, "version": version_name(row.version), "verdict": verdict["gate"]},
    )
    return eval_json(row)


def fail(session: Session, eval_id: str, error: str) -> bool:
    """Mark a running evaluation failed with ``error``; False when it was not running."""
    row = repo.get_evaluation(session, eval_id, for_update=True)
    if row is None or row.status != "running":
        return False
    _fail_row(session, row, error)
    return True


def _fail_row(session: Session, row: EvaluationRow, error: str) -> None:
    row.status, row.error, row.finished_at = "failed", error[:ERROR_MAX_CHARS], utcnow()
    repo.flush(session)
    record_change(
        session,
        actor=EVALUATOR,
        action="evaluation.failed",
        subject_type="adapter",
        subject_id=row.adapter_id,
        details={"evaluation_id": row.id, "version": version_name(row.version), "error": row.error},
    )


def claim_unclaimed(session: Session, worker: str, limit: int) -> list[str]:
    """Claim up to ``limit`` running evaluations no process runs yet (oldest first) for ``worker``."""
    rows = repo.unclaimed(session, limit)
    for row in rows:
        row.worker, row.heartbeat_at = worker, utcnow()
    repo.flush(session)
    return [r.id for r in rows]


def fail_stale(session: Session, stale_after_s: float) -> list[str]:
    """Fail every running evaluation whose heartbeat is older than ``stale_after_s`` (the process
    running it stopped); returns their ids."""
    cutoff: datetime = utcnow() - timedelta(seconds=stale_after_s)
    rows = repo.stale_running(session, cutoff)
    for row in rows:
        if row.worker is None:
            why = (
                f"no evaluator picked it up within {stale_after_s:g} s (LORAPLANE_EVAL_IN_PROCESS is "
                "false: is `loraplane serve --role evaluator` running?)"
            )
        else:
            why = (
                f"interrupted: the process running it ({row.worker}) stopped reporting for over "
                f"{stale_after_s:g} s (restarted or killed); start a new evaluation"
            )
        _fail_row(session, row, why)
    return [r.id for r in rows]
