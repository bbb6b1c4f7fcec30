"""Approval before promote (SPEC §14, §19).

``approvals_required`` (≥ 0) is set on a base model and may be overridden per adapter (null =
the base model's). With 0, :func:`promote_or_request` promotes at once (SPEC §4). Above 0 it
checks the promotion could run now (same rules as :func:`registry.services.lifecycle.promote`,
quality gate included) and records a ``pending`` request instead, changing nothing served. The
request remembers what it was made against (``seen``: the adapter's active and canary versions,
the version's status and quality gate) and whether it was ``force``d past a blocking gate.

:func:`approve` locks the adapter row, then the request row (the state machine locks the
adapter first too, so the two never deadlock), and refuses: the requester itself (403
``self_approval``); the principal who recorded the version's quality gate by hand (403
``gate_setter_approval``: separation of duties — whoever judged the version's quality cannot also
be the approval that lets it through, so it always takes someone else); a second approval by one
principal (409 ``already_approved``); a request no longer pending (409 ``promotion_stale`` for a
stale one, ``promotion_not_pending`` otherwise). A request found expired is written ``expired``
(409 ``promotion_expired``); one whose adapter, version status or version gate changed is written
``stale`` (409 ``promotion_stale``) — these two are committed before the error is answered, so
the caller gets an :class:`Outcome` with ``error`` set rather than an exception. :func:`reject`
refuses expired and stale requests the same way. When distinct approvals reach the number
required (as requested, or more if ``approvals_required`` was raised since), the promotion runs
in the same transaction (quality gate checked again; a refusal rolls the approval back too) and
the request becomes ``executed``.

Audit: ``promotion.requested`` (always with ``force`` and the ``quality_gate`` seen, plus
``forced_quality_gate`` when the force overrides a blocking gate) / ``approved`` / ``rejected``
(no revision bump: nothing served changes) and ``promotion.executed`` next to the promote's own
``version.promoted`` / ``version.canary`` event (``details.promotion_id``).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy.orm import Session

from kit.errors import Conflict, Forbidden, InvalidRequest, LoraplaneError, NotFound
from kit.ids import version_name
from registry.auth import PLATFORM_ACTORS, Principal
from registry.models import PromotionRequestRow, utcnow
from registry.repositories import audit as audit_repo
from registry.repositories import promotions as repo
from registry.repositories.pagination import Page, clamp_limit, decode_cursor, page_of
from registry.services import lifecycle
from registry.services.approvals import approvals_required
from registry.services.records import AdapterRecord
from registry.services.staleness import is_stale

STATUSES = ("pending", "executed", "rejected", "expired", "stale")


@dataclass(frozen=True, slots=True)
class ApprovalRecord:
    principal: str
    at: datetime


@dataclass(frozen=True, slots=True)
class SeenRecord:
    """What a request was made against; a change of any of it makes the request ``stale``."""

    active_version: str | None
    canary_version: str | None
    version_status: str
    quality_gate: str | None  # null: a request made before gates were recorded on requests


@dataclass(frozen=True, slots=True)
class PromotionRecord:
    id: str
    adapter_id: str
    version: str
    canary_weight: int | None
    force: bool
    requested_by: str
    status: str
    approvals: list[ApprovalRecord]
    approvals_required: int
    seen: SeenRecord
    created_at: datetime
    expires_at: datetime
    decided_by: str | None
    decided_at: datetime | None
    comment: str | None

    @classmethod
    def of(cls, row: PromotionRequestRow, now: datetime | None = None) -> PromotionRecord:
        status = row.status
        if status == "pending" and row.expires_at <= (now or utcnow()):
            status = "expired"
        return cls(
            id=row.id,
            adapter_id=row.adapter_id,
            version=version_name(row.version),
            canary_weight=row.canary_weight,
            force=bool(row.force),
            requested_by=row.requested_by,
            status=status,
            approvals=[
                ApprovalRecord(principal=a["principal"], at=_parse_ts(a["at"])) for a in row.approvals
            ],
            approvals_required=row.approvals_required,
            seen=SeenRecord(
                active_version=version_name(row.seen_active_version) if row.seen_active_version else None,
                canary_version=version_name(row.seen_canary_version) if row.seen_canary_version else None,
                version_status=row.seen_version_status,
                quality_gate=row.seen_quality_gate,
            ),
            created_at=row.created_at,
            expires_at=row.expires_at,
            decided_by=row.decided_by,
            decided_at=row.decided_at,
            comment=row.comment,
        )


def _parse_ts(value: str) -> datetime:
    return datetime.fromisoformat(value)


@dataclass(frozen=True, slots=True)
class Outcome:
    """What a promote or an approval did. ``promotion``: the request (when there is one);
    ``adapter``: the adapter as described after a promotion ran; ``error``: a refusal to answer
    after the commit (the request was written ``expired`` or ``stale``)."""

    promotion: PromotionRecord | None = None
    adapter: AdapterRecord | None = None
    error: LoraplaneError | None = field(default=None)


def _new_id() -> str:
    """Time-ordered, so listing by id is listing by creation."""
    return f"pr-{time.time_ns() // 1_000_000:012x}{os.urandom(4).hex()}"


def _event(session: Session, actor: str, action: str, req: PromotionRequestRow, **details: Any) -> None:
    audit_repo.add(
        session,
        actor=actor,
        action=action,
        subject_type="adapter",
        subject_id=req.adapter_id,
        details={"promotion_id": req.id, "version": version_name(req.version), **details},
    )


def promote_or_request(
    session: Session,
    adapter_id: str,
    version: str,
    *,
    canary_weight: int | None,
    force: bool,
    actor: str,
    ttl_s: float,
) -> Outcome:
    st = lifecycle.locked(session, adapter_id)
    required = approvals_required(session, st.adapter)
    if required == 0:
        return Outcome(
            adapter=lifecycle.promote(
                session, adapter_id, version, canary_weight=canary_weight, force=force, actor=actor
            )
        )
    target, forced = lifecycle.check_promote(st, version, canary_weight=canary_weight, force=force)
    for other in repo.pending_of(session, adapter_id):
        if (
            other.version == target.number
            and other.canary_weight == canary_weight
            and other.expires_at > utcnow()
        ):
            raise Conflict(
                f"promotion of {version_name(target.number)} is already requested ({other.id})",
                code="promotion_already_requested",
                details={"promotion_id": other.id},
            )
    now = utcnow()
    req = PromotionRequestRow(
        id=_new_id(),
        adapter_id=adapter_id,
        version=target.number,
        canary_weight=canary_weight,
        force=force is True,
        requested_by=actor,
        status="pending",
        approvals_required=required,
        approvals=[],
        seen_active_version=st.adapter.active_version,
        seen_canary_version=st.adapter.canary_version,
        seen_version_status=target.status,
        seen_quality_gate=target.quality_gate,
        created_at=now,
        expires_at=now + timedelta(seconds=ttl_s),
    )
    repo.add(session, req)
    note = {"forced_quality_gate": forced} if forced is not None else {}
    _event(
        session,
        actor,
        "promotion.requested",
        req,
        canary_weight=canary_weight,
        approvals_required=required,
        force=req.force,
        quality_gate=target.quality_gate,
        **note,
    )
    return Outcome(promotion=PromotionRecord.of(req, now))


def _locked(session: Session, promotion_id: str) -> tuple[lifecycle.LockedAdapter, PromotionRequestRow]:
    first = repo.get(session, promotion_id)
    if first is None:
        raise NotFound(f"promotion request {promotion_id!r} not found", code="promotion_not_found")
    st = lifecycle.locked(session, first.adapter_id)  # the adapter first, as the state machine does
    req = repo.get(session, promotion_id, for_update=True)
    if req is None:
        raise NotFound(f"promotion request {promotion_id!r} not found", code="promotion_not_found")
    return st, req


def _close_if_over(
    st: lifecycle.LockedAdapter, req: PromotionRequestRow, now: datetime
) -> LoraplaneError | None:
    """Write ``expired`` / ``stale`` when it is; the error to answer, or None."""
    if req.status == "pending" and req.expires_at <= now:
        req.status = "expired"
        req.decided_at = now
        return Conflict(
            f"promotion request {req.id} expired at {req.expires_at.isoformat()}", code="promotion_expired"
        )
    if req.status == "stale":
        raise _stale(req)
    if req.status != "pending":
        raise Conflict(f"promotion request {req.id} is {req.status}", code="promotion_not_pending")
    if is_stale(req, st.adapter, st.versions.get(req.version)):
        req.status = "stale"
        req.decided_at = now
        return _stale(req)
    return None


def _stale(req: PromotionRequestRow) -> Conflict:
    return Conflict(
        f"adapter {req.adapter_id!r} or its version {version_name(req.version)} changed since promotion "
        f"request {req.id} was made (active or canary version, the version's status or quality gate); "
        "request it again",
        code="promotion_stale",
        details={"promotion_id": req.id},
    )


def _check_gate_setter(st: lifecycle.LockedAdapter, req: PromotionRequestRow, principal: Principal) -> None:
    """Separation of duties: the principal who recorded the version's quality gate by hand may not
    approve its promotion (the platform's own actors, e.g. ``evaluator``, are not a person)."""
    version = st.versions.get(req.version)
    setter = version.quality_gate_by if version is not None else None
    if setter is not None and setter == principal.id and setter not in PLATFORM_ACTORS:
        raise Forbidden(
            f"principal {principal.id!r} recorded the quality gate of {version_name(req.version)} by hand "
            "and cannot also approve its promotion: another approver must",
            code="gate_setter_approval",
            details={"quality_gate_by": setter},
        )


def approve(session: Session, promotion_id: str, principal: Principal, *, comment: str | None) -> Outcome:
    st, req = _locked(session, promotion_id)
    now = utcnow()
    if req.status == "pending" and principal.id == req.requested_by:
        raise Forbidden(
            f"principal {principal.id!r} requested this promotion and cannot approve it", code="self_approval"
        )
    err = _close_if_over(st, req, now)
    if err is not None:
        repo.flush(session)
        return Outcome(promotion=PromotionRecord.of(req, now), error=err)
    _check_gate_setter(st, req, principal)
    if any(a["principal"] == principal.id for a in req.approvals):
        raise Conflict(f"principal {principal.id!r} already approved {req.id}", code="already_approved")
    req.approvals = [*req.approvals, {"principal": principal.id, "at": now.isoformat()}]
    repo.flush(session)
    _event(session, principal.id, "promotion.approved", req, comment=comment, approvals=len(req.approvals))
    # the number asked when requested, or more if it was raised since (never fewer)
    needed = max(req.approvals_required, approvals_required(session, st.adapter))
    if needed != req.approvals_required:
        req.approvals_required = needed
        repo.flush(session)
    if len(req.approvals) < needed:
        return Outcome(promotion=PromotionRecord.of(req, now))
    req.status = "executed"
    req.decided_by = principal.id
    req.decided_at = now
    repo.flush(session)
    adapter = lifecycle.promote(
        session,
        req.adapter_id,
        version_name(req.version),
        canary_weight=req.canary_weight,
        force=req.force,
        actor=principal.id,
        note={"promotion_id": req.id, "requested_by": req.requested_by},
    )
    _event(
        session,
        principal.id,
        "promotion.executed",
        req,
        canary_weight=req.canary_weight,
        requested_by=req.requested_by,
        approved_by=[a["principal"] for a in req.approvals],
    )
    return Outcome(promotion=PromotionRecord.of(req, now), adapter=adapter)


def reject(session: Session, promotion_id: str, principal: Principal, *, comment: str | None) -> Outcome:
    st, req = _locked(session, promotion_id)
    now = utcnow()
    err = _close_if_over(st, req, now)
    if err is not None:  # expired or stale: written so, and answered 409 (SPEC §19)
        repo.flush(session)
        return Outcome(promotion=PromotionRecord.of(req, now), error=err)
    req.status = "rejected"
    req.decided_by = principal.id
    req.decided_at = now
    req.comment = comment
    repo.flush(session)
    _event(session, principal.id, "promotion.rejected", req, comment=comment)
    return Outcome(promotion=PromotionRecord.of(req, now))


def get_promotion(session: Session, promotion_id: str) -> PromotionRecord:
    row = repo.get(session, promotion_id)
    if row is None:
        raise NotFound(f"promotion request {promotion_id!r} not found", code="promotion_not_found")
    return PromotionRecord.of(row)


def list_promotions(
    session: Session,
    *,
    limit: int | None = None,
    cursor: str | None = None,
    status: str | None = None,
    adapter_id: str | None = None,
) -> Page[PromotionRecord]:
    if status is not None and status not in STATUSES:
        raise InvalidRequest(f"status must be one of {', '.join(STATUSES)}", details={"field": "status"})
    n = clamp_limit(limit)
    now = utcnow()
    rows = repo.list_rows(
        session, limit=n, now=now, after=decode_cursor(cursor, str), status=status, adapter_id=adapter_id
    )
    items, nxt = page_of(rows, n, lambda r: r.id)
    return Page([PromotionRecord.of(r, now) for r in items], nxt)
