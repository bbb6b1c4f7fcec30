"""The console's state changes: what each button does, and exactly what it will change.

An action runs the same service function the admin API's route runs (``registry.services``):
promote and canary go through ``promotions.promote_or_request``, so an adapter that needs
approvals gets a pending promotion request, exactly as ``POST …/promote`` answers 202.
The confirmation page previews it by running that function in a transaction that is rolled back
(nothing is committed, audited or published) and describing the difference between the adapter
before and after — so the preview never re-implements the state machine's rules, and a change
the service would refuse (409 ``no_rollback_target``, a failed quality gate …) is shown as the
error it would be, without a confirm button.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from sqlalchemy.orm import Session

from kit.errors import InvalidRequest, LoraplaneError
from registry.api.deps import AdminState, write
from registry.services import adapters as adapter_svc
from registry.services import lifecycle
from registry.services import promotions as promo_svc
from registry.services.promotions import PromotionRecord
from registry.services.records import AdapterRecord


@dataclass(frozen=True, slots=True)
class Action:
    name: str
    label: str
    permission: str
    needs_version: bool = False


ACTIONS: dict[str, Action] = {
    a.name: a
    for a in (
        Action("promote", "Promote", "adapter.promote", needs_version=True),
        Action("canary", "Start canary", "adapter.promote", needs_version=True),
        Action("rollback", "Roll back", "adapter.rollback"),
        Action("disable", "Disable adapter", "adapter.disable"),
        Action("enable", "Enable adapter", "adapter.enable"),
        Action("disable_version", "Disable version", "version.disable", needs_version=True),
        Action("enable_version", "Enable version", "version.enable", needs_version=True),
        Action("end_canary", "End canary", "adapter.rollback"),
    )
}


@dataclass(frozen=True, slots=True)
class Change:
    """One requested change, parsed from a form or a confirmation link."""

    action: Action
    adapter_id: str
    version: str | None
    weight: int | None


def parse(action: str, adapter_id: str, version: str | None, weight: str | None) -> Change:
    act = ACTIONS.get(action)
    if act is None:
        raise InvalidRequest(f"unknown action {action!r}", details={"field": "action"})
    if act.needs_version and not version:
        raise InvalidRequest(f"{act.label} needs a version", details={"field": "version"})
    w: int | None = None
    if act.name == "canary":
        try:
            w = int(weight or "")
        except ValueError:
            raise InvalidRequest(
                "canary weight must be a whole percentage", details={"field": "weight"}
            ) from None
        if not 1 <= w <= 99:
            raise InvalidRequest("canary weight must be between 1 and 99 %", details={"field": "weight"})
    return Change(act, adapter_id, version if act.needs_version else None, w)


@dataclass(frozen=True, slots=True)
class Done:
    """What a change did: the adapter afterwards, or the promotion request it recorded instead."""

    adapter: AdapterRecord | None
    promotion: PromotionRecord | None = None


def _runner(st: AdminState, req: Change, actor: str) -> Callable[[Session], Done]:
    a, v = req.adapter_id, req.version or ""
    name = req.action.name
    if name in ("promote", "canary"):
        weight = req.weight if name == "canary" else None
        ttl = st.settings.promotion_ttl_s

        def promote(s: Session) -> Done:
            out = promo_svc.promote_or_request(
                s, a, v, canary_weight=weight, force=False, actor=actor, ttl_s=ttl
            )
            return Done(out.adapter, out.promotion)

        return promote
    if name == "rollback":
        return lambda s: Done(lifecycle.rollback(s, a, actor=actor))
    if name == "disable":
        return lambda s: Done(lifecycle.set_adapter_enabled(s, a, False, actor=actor))
    if name == "enable":
        return lambda s: Done(lifecycle.set_adapter_enabled(s, a, True, actor=actor))
    if name == "end_canary":
        return lambda s: Done(lifecycle.end_canary(s, a, actor=actor))
    if name == "enable_version":
        return lambda s: Done(lifecycle.enable_version(s, a, v, actor=actor))
    return lambda s: Done(lifecycle.disable_version(s, a, v, actor=actor))


def requested(p: PromotionRecord) -> str:
    what = f"{p.version} as a {p.canary_weight} % canary" if p.canary_weight is not None else p.version
    return (
        f"Nothing served changes yet: a promotion request for {what} is recorded ({p.id}). It runs "
        f"once {p.approvals_required} approver(s) other than {p.requested_by} approve it, "
        f"before {p.expires_at:%Y-%m-%d %H:%M} UTC."
    )


@dataclass(frozen=True, slots=True)
class Preview:
    before: AdapterRecord
    lines: list[str]  # what will change, one sentence each; empty when nothing would
    error: LoraplaneError | None  # what the service would answer instead


def preview(st: AdminState, req: Change, actor: str) -> Preview:
    """Run the change in a transaction that is always rolled back; describe the difference."""
    session = st.factory()
    try:
        before = adapter_svc.describe_adapter(session, req.adapter_id)
        try:
            done = _runner(st, req, actor)(session)
        except LoraplaneError as e:
            return Preview(before, [], e)
        if done.promotion is not None:
            return Preview(before, [requested(done.promotion)], None)
        assert done.adapter is not None
        return Preview(before, describe_change(before, done.adapter), None)
    finally:
        session.rollback()
        session.close()


def apply(st: AdminState, req: Change, actor: str) -> Done:
    """Make the change for real: one transaction with its audit event, then publish."""
    return write(st, _runner(st, req, actor))


def _served(rec: AdapterRecord) -> str:
    if rec.status == "disabled":
        return "nothing (the adapter is disabled: requests fail fast with 403 adapter_disabled)"
    if rec.active_version is None:
        return "nothing (no active version: BASE:ADAPTER answers 404 model_not_found)"
    if rec.canary_version is not None and rec.canary_weight is not None:
        return (
            f"{rec.active_version} {100 - rec.canary_weight} % and "
            f"canary {rec.canary_version} {rec.canary_weight} %"
        )
    return f"{rec.active_version} 100 %"


def describe_change(before: AdapterRecord, after: AdapterRecord) -> list[str]:
    """Sentences that say what differs between two describe records of one adapter."""
    lines: list[str] = []
    if before.status != after.status:
        if after.status == "disabled":
            lines.append(
                f"Adapter {after.id} is disabled: every request for it fails fast with 403 "
                "adapter_disabled and replicas unload it."
            )
        else:
            lines.append(f"Adapter {after.id} is enabled again.")
    if before.active_version != after.active_version:
        lines.append(f"Active version: {before.active_version or 'none'} → {after.active_version or 'none'}.")
    b_canary = f"{before.canary_version} at {before.canary_weight} %" if before.canary_version else "none"
    a_canary = f"{after.canary_version} at {after.canary_weight} %" if after.canary_version else "none"
    if b_canary != a_canary:
        lines.append(f"Canary: {b_canary} → {a_canary}.")
    old = {v.version: v for v in before.versions or []}
    for v in after.versions or []:
        prev = old.get(v.version)
        if prev is None:
            continue
        if prev.status != v.status:
            lines.append(f"Version {v.version}: {prev.status} → {v.status}.")
        if prev.rollback_to != v.rollback_to and v.rollback_to is not None:
            lines.append(f"A later rollback from {v.version} returns to {v.rollback_to}.")
    if _served(before) != _served(after):
        lines.append(f"Traffic served: {_served(before)} → {_served(after)}.")
    return lines
