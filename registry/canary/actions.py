"""What the analyser changes in the registry, through the registry's own state machine (one
transaction each, audit event included; SPEC §4, §14, §16). Actor: ``canary-analyzer``.

- :func:`watched_canaries`: canaries to analyse, with their policy, when they began (the
  latest ``version.canary`` event of that version) and their regression set's format checks.
- :func:`abort_canary`: the registry's end-canary call (:func:`registry.services.lifecycle.end_canary`:
  the canary version back to ``ready``), audit ``version.canary_aborted`` with the evidence. A
  no-op when the canary changed meanwhile.
- :func:`auto_promote`: ``promote`` where no approval is needed, else a promotion request.

Both run through the analyser's :class:`registry.writer.ChangeWriter`, so gateways hear of the
change as they do of the admin API's (SPEC §19).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from sqlalchemy.orm import Session

from kit.ids import version_name
from registry.canary import repository as repo
from registry.canary.checks import FormatGroups, format_groups
from registry.canary.policy import CanaryPolicy
from registry.models import utcnow
from registry.services import lifecycle, promotions

ACTOR = "canary-analyzer"


@dataclass(frozen=True, slots=True)
class WatchedCanary:
    adapter_id: str
    active_version: str
    canary_version: str
    canary_weight: int
    policy: CanaryPolicy
    since: datetime  # when this version became the canary (at this weight)
    format_checks: FormatGroups = ()  # the regression set's format checks (registry.canary.checks)


def watched_canaries(session: Session) -> list[WatchedCanary]:
    out = []
    for row in repo.watched(session):
        assert row.canary_version is not None and row.active_version is not None
        canary = version_name(row.canary_version)
        since = next(
            (ts for ts, details in repo.canary_events(session, row.id) if details.get("version") == canary),
            None,
        )
        out.append(
            WatchedCanary(
                adapter_id=row.id,
                active_version=version_name(row.active_version),
                canary_version=canary,
                canary_weight=int(row.canary_weight or 0),
                policy=CanaryPolicy.of(row.canary_policy or {}),
                since=since or utcnow(),
                format_checks=format_groups(session, row.id),
            )
        )
    return out


def _still(st: lifecycle.LockedAdapter, w: WatchedCanary) -> bool:
    a = st.adapter
    return (
        a.canary_version is not None
        and version_name(a.canary_version) == w.canary_version
        and a.active_version is not None
        and version_name(a.active_version) == w.active_version
    )


def abort_canary(session: Session, w: WatchedCanary, evidence: dict[str, Any]) -> bool:
    """Clear the canary (if it is still ``w``'s); True when it was cleared."""
    st = lifecycle.locked(session, w.adapter_id)
    if not _still(st, w):
        return False
    lifecycle.end_canary(
        session,
        w.adapter_id,
        actor=ACTOR,
        action="version.canary_aborted",
        note={"policy": w.policy.to_dict(), **evidence},
    )
    return True


def auto_promote(
    session: Session, w: WatchedCanary, *, ttl_s: float
) -> Literal["promoted", "requested", "gone"]:
    """Promote the canary (or request it where approvals are required). Raises the registry's
    own refusals (e.g. 409 ``quality_gate_failed``, ``promotion_already_requested``)."""
    st = lifecycle.locked(session, w.adapter_id)
    if not _still(st, w):
        return "gone"
    out = promotions.promote_or_request(
        session, w.adapter_id, w.canary_version, canary_weight=None, force=False, actor=ACTOR, ttl_s=ttl_s
    )
    return "requested" if out.promotion is not None else "promoted"
