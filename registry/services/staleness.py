"""A pending promotion request goes ``stale`` when what it was approved against changes: the
adapter's active or canary version, or the requested version's status or quality gate (SPEC §14,
§19; requests made before the gate was recorded on them, ``seen_quality_gate`` null, are not
checked against it). The state machine (:mod:`registry.services.lifecycle`) calls
:func:`mark_stale` after every change, in the change's transaction, and so does
:func:`registry.services.gates.set_quality_gate` after a gate change; approving and rejecting
check :func:`is_stale` again under the row locks."""

from __future__ import annotations

from sqlalchemy.orm import Session

from registry.models import AdapterRow, PromotionRequestRow, VersionRow, utcnow
from registry.repositories import promotions as repo


def is_stale(req: PromotionRequestRow, adapter: AdapterRow, version: VersionRow | None) -> bool:
    return (
        version is None
        or adapter.active_version != req.seen_active_version
        or adapter.canary_version != req.seen_canary_version
        or version.status != req.seen_version_status
        or (req.seen_quality_gate is not None and version.quality_gate != req.seen_quality_gate)
    )


def mark_stale(session: Session, adapter: AdapterRow, versions: dict[int, VersionRow]) -> list[str]:
    """Mark the adapter's pending requests that no longer match as ``stale``; returns their ids."""
    marked: list[str] = []
    for req in repo.pending_of(session, adapter.id):
        if req.status == "pending" and is_stale(req, adapter, versions.get(req.version)):
            req.status = "stale"
            req.decided_at = utcnow()
            marked.append(req.id)
    if marked:
        repo.flush(session)
    return marked
