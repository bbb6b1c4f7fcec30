"""Quality gates: every version carries ``quality_gate`` (``pending`` | ``passed`` | ``failed`` |
``skipped``) and the ``quality_gate_details`` recorded with it (a JSON object, e.g. eval scores).

- At upload the gate is ``skipped`` (the default: nothing to wait for) or ``pending`` (an eval
  will report); ``passed``/``failed`` are results, recorded later with :func:`set_quality_gate`.
- :func:`set_quality_gate` locks the adapter row (so it serialises with promotions), replaces the
  gate and its details (no details → null), records who set it (``quality_gate_by``: the
  separation of duties of :mod:`registry.services.promotions` reads it) and writes one
  ``version.quality_gate`` event (``details``: version, from, to, details) with a revision bump,
  in the caller's transaction. A gate that changes makes the version's pending promotion requests
  ``stale`` (SPEC §19). A call that changes nothing (same gate, same details) writes nothing.
  Disabled versions can still have their gate recorded.
- Promotion (active or canary) of a ``pending`` version is refused with 409
  ``quality_gate_pending``, of a ``failed`` one with 409 ``quality_gate_failed``, unless forced:
  :func:`check_promotable`. Rollback is never gated (it restores a version that was in service).

Gates do not change routing: the snapshot carries no gate, and a pinned ``BASE:ADAPTER@vN`` of a
pending version is served, so an eval can run against the candidate before it is promoted.
"""

from __future__ import annotations

import json
from typing import Any

from sqlalchemy.orm import Session

from kit.errors import Conflict, InvalidRequest
from kit.ids import version_name
from registry.repositories import adapters as repo
from registry.services.adapters import adapter_row, version_row
from registry.services.audit import record_change
from registry.services.records import VersionRecord
from registry.services.staleness import mark_stale

QUALITY_GATES = ("pending", "passed", "failed", "skipped")
UPLOAD_GATES = ("pending", "skipped")  # what an upload may start with
DEFAULT_UPLOAD_GATE = "skipped"
BLOCKING = {"pending": "quality_gate_pending", "failed": "quality_gate_failed"}
MAX_DETAILS_BYTES = 64 * 1024


def check_upload_gate(value: Any) -> str:
    """The gate a new version starts with: ``pending`` or ``skipped``; else 422."""
    if not isinstance(value, str) or value not in UPLOAD_GATES:
        raise InvalidRequest(
            "quality_gate at upload must be 'pending' or 'skipped' (record passed/failed later "
            "with POST …/versions/{v}/quality-gate)",
            details={"field": "quality_gate", "value": value if isinstance(value, str) else None},
        )
    return value


def check_gate(value: Any) -> str:
    if not isinstance(value, str) or value not in QUALITY_GATES:
        raise InvalidRequest(
            "status must be one of pending, passed, failed, skipped",
            details={"field": "status", "value": value if isinstance(value, str) else None},
        )
    return value


def check_details(details: Any) -> dict[str, Any] | None:
    """``details`` must be a JSON object (or null) of at most 64 KiB of JSON, with finite numbers
    only and valid Unicode (what both databases and the JSON answers can hold); else 422."""
    if details is None:
        return None
    if not isinstance(details, dict):
        raise InvalidRequest("details must be a JSON object or null", details={"field": "details"})
    try:
        text = json.dumps(details, ensure_ascii=False, allow_nan=False)
        size = len(text.encode("utf-8"))
    except (TypeError, ValueError, RecursionError):  # NaN/Infinity; UnicodeEncodeError is a ValueError
        raise InvalidRequest(
            "details must be plain JSON: finite numbers, valid Unicode", details={"field": "details"}
        ) from None
    if size > MAX_DETAILS_BYTES:
        raise InvalidRequest(
            f"details must be at most {MAX_DETAILS_BYTES} bytes of JSON",
            details={"field": "details", "max_bytes": MAX_DETAILS_BYTES},
        )
    return details


def check_promotable(gate: str, version: str, *, force: bool) -> str | None:
    """Raise 409 ``quality_gate_pending`` / ``quality_gate_failed`` for a blocking gate unless
    ``force``; returns the gate that was overridden (for the audit event), else None."""
    code = BLOCKING.get(gate)
    if code is None:
        return None
    if force:
        return gate
    why = "has not passed its quality gate yet" if gate == "pending" else "failed its quality gate"
    raise Conflict(
        f"version {version} {why}: record the result (POST …/versions/{version}/quality-gate) "
        "or promote with force",
        code=code,
        details={"version": version, "quality_gate": gate},
    )


def set_quality_gate(
    session: Session,
    adapter_id: str,
    version: str,
    status: str,
    details: dict[str, Any] | None = None,
    *,
    actor: str,
) -> VersionRecord:
    """Record a gate result (see module doc); returns the version record."""
    check_gate(status)
    details = check_details(details)
    adapter = adapter_row(session, adapter_id, for_update=True)
    row = version_row(session, adapter_id, version)
    before = row.quality_gate
    if before == status and row.quality_gate_details == details:
        return VersionRecord.of(row)
    row.quality_gate = status
    row.quality_gate_details = details
    row.quality_gate_by = actor
    repo.flush(session)
    if before != status:
        mark_stale(session, adapter, {v.number: v for v in repo.versions_of(session, adapter_id)})
    record_change(
        session,
        actor=actor,
        action="version.quality_gate",
        subject_type="adapter",
        subject_id=adapter_id,
        details={"version": version_name(row.number), "from": before, "to": status, "details": details},
    )
    return VersionRecord.of(row)
