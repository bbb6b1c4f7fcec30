"""The state machine of SPEC §4 / §13 / §19: promote, canary, end a canary, rollback, kill
switches, re-enable a version.

Every function locks the adapter row first (``SELECT … FOR UPDATE`` on PostgreSQL; SQLite
serialises writers with ``BEGIN IMMEDIATE``), reads the versions after the lock, changes them in
an order that never has two active (or two canary) versions even between statements (the
partial unique indexes would refuse it), and records the change (audit + revision) in the
same transaction. Each returns the adapter as described (with its versions).

Version statuses: ``ready`` → ``canary`` / ``active`` → ``retired``; any → ``disabled`` →
``ready`` (:func:`enable_version`).

Rollback while a canary runs drops the canary and keeps the active version; without one it steps
back along ``rollback_to`` (SPEC §19). :func:`end_canary` drops the canary alone, idempotently.
Disabling the active version rolls back and writes ``adapter.rolled_back`` next to
``version.disabled``.

Promotion respects quality gates (:mod:`registry.services.gates`): a ``pending`` or ``failed``
version is refused (409 ``quality_gate_pending`` / ``quality_gate_failed``) unless ``force``, and
a forced promotion records ``forced_quality_gate`` in its audit event. Rollback is not gated.

Every change marks the adapter's pending promotion requests that no longer match ``stale``
(:mod:`registry.services.staleness`, SPEC §14). ``note``: extra audit ``details`` (a bulk
operation's ``bulk_id`` and ``reason``, an approved request's ``promotion_id``).
"""

from __future__ import annotations

from typing import Any

from sqlalchemy.orm import Session

from kit.errors import Conflict, InvalidRequest, NotFound
from kit.ids import version_name
from registry.models import AdapterRow, VersionRow
from registry.repositories import adapters as repo
from registry.services.adapters import adapter_row, parse_version
from registry.services.audit import record_change
from registry.services.gates import check_promotable
from registry.services.records import AdapterRecord
from registry.services.rollback_chain import rollback_step
from registry.services.staleness import mark_stale


class LockedAdapter:
    """The locked adapter and its versions, with helpers that keep both sides in sync."""

    def __init__(self, session: Session, adapter_id: str) -> None:
        self.session = session
        self.adapter: AdapterRow = adapter_row(session, adapter_id, for_update=True)
        self.versions: dict[int, VersionRow] = {v.number: v for v in repo.versions_of(session, adapter_id)}

    def with_status(self, status: str) -> VersionRow | None:
        for v in self.versions.values():
            if v.status == status:
                return v
        return None

    def version(self, version: str) -> VersionRow:
        n = parse_version(version)
        row = self.versions.get(n)
        if row is None:
            raise NotFound(
                f"version {version} of adapter {self.adapter.id!r} not found", code="version_not_found"
            )
        return row

    def clear_canary(self) -> str | None:
        """Send the canary (if any) back to ``ready``; returns its name."""
        canary = self.with_status("canary")
        self.adapter.canary_version = None
        self.adapter.canary_weight = None
        if canary is None:
            return None
        canary.status = "ready"
        repo.flush(self.session)
        return version_name(canary.number)

    def rollback_target(self, start: VersionRow) -> VersionRow | None:
        """Follow ``rollback_to`` from ``start``, skipping disabled versions (cycle-safe)."""

        def link(n: int) -> tuple[str, int | None] | None:
            v = self.versions.get(n)
            return (v.status, v.rollback_to) if v is not None else None

        back = rollback_step(start.number, link)
        return self.versions[back] if back is not None else None

    def activate(
        self, target: VersionRow, *, retire: VersionRow | None, retire_status: str = "retired"
    ) -> None:
        if retire is not None:
            retire.status = retire_status
            repo.flush(self.session)
        target.status = "active"
        self.adapter.active_version = target.number
        repo.flush(self.session)

    def describe(self) -> AdapterRecord:
        """The adapter as described after the change; marks stale promotion requests first."""
        mark_stale(self.session, self.adapter, self.versions)
        return AdapterRecord.of(self.adapter, sorted(self.versions.values(), key=lambda v: v.number))


def locked(session: Session, adapter_id: str) -> LockedAdapter:
    """The adapter row locked for this transaction, with its versions."""
    return LockedAdapter(session, adapter_id)


def check_promote(
    st: LockedAdapter, version: str, *, canary_weight: int | None, force: bool
) -> tuple[VersionRow, str | None]:
    """The checks of :func:`promote` without the change: the target version and the quality
    gate that a force overrides (or None). Raises what :func:`promote` would."""
    target = st.version(version)
    name = version_name(target.number)
    if target.status == "disabled":
        raise Conflict(f"version {name} is disabled and cannot be promoted", code="version_disabled")
    if target.status == "active":
        raise Conflict(f"version {name} is already the active version", code="already_active")
    if canary_weight is not None and (isinstance(canary_weight, bool) or not 1 <= canary_weight <= 99):
        raise InvalidRequest(
            "canary_weight must be an integer from 1 to 99", details={"field": "canary_weight"}
        )
    forced = check_promotable(target.quality_gate, name, force=force is True)
    if canary_weight is not None and st.with_status("active") is None:
        raise Conflict(
            f"adapter {st.adapter.id!r} has no active version to split traffic with",
            code="no_active_version",
        )
    return target, forced


def promote(
    session: Session,
    adapter_id: str,
    version: str,
    *,
    canary_weight: int | None = None,
    force: bool = False,
    actor: str,
    note: dict[str, Any] | None = None,
) -> AdapterRecord:
    st = LockedAdapter(session, adapter_id)
    target, forced = check_promote(st, version, canary_weight=canary_weight, force=force)
    name = version_name(target.number)
    gate_note = {"forced_quality_gate": forced} if forced is not None else {}
    gate_note.update(note or {})
    active = st.with_status("active")

    if canary_weight is not None:
        current = st.with_status("canary")
        replaced = None
        if current is not None and current.number != target.number:
            replaced = st.clear_canary()
        target.status = "canary"
        st.adapter.canary_version = target.number
        st.adapter.canary_weight = canary_weight
        repo.flush(session)
        record_change(
            session,
            actor=actor,
            action="version.canary",
            subject_type="adapter",
            subject_id=adapter_id,
            details={"version": name, "canary_weight": canary_weight, "replaced": replaced, **gate_note},
        )
        return st.describe()

    cleared = None
    if st.with_status("canary") is not None and st.with_status("canary") is not target:
        cleared = st.clear_canary()
    elif target.status == "canary":
        st.adapter.canary_version = None
        st.adapter.canary_weight = None
    target.rollback_to = active.number if active is not None else None
    st.activate(target, retire=active)
    record_change(
        session,
        actor=actor,
        action="version.promoted",
        subject_type="adapter",
        subject_id=adapter_id,
        details={
            "version": name,
            "previous": version_name(active.number) if active is not None else None,
            "canary_cleared": cleared,
            **gate_note,
        },
    )
    return st.describe()


def end_canary(
    session: Session,
    adapter_id: str,
    *,
    actor: str,
    note: dict[str, Any] | None = None,
    action: str = "version.canary_cleared",
) -> AdapterRecord:
    """Clear the canary (back to ``ready``), active untouched; no canary: nothing changes.
    ``action``: the audit action (the canary analyser's abort is ``version.canary_aborted``)."""
    st = LockedAdapter(session, adapter_id)
    weight = st.adapter.canary_weight
    cleared = st.clear_canary()
    if cleared is None:
        return st.describe()
    active = st.adapter.active_version
    record_change(
        session,
        actor=actor,
        action=action,
        subject_type="adapter",
        subject_id=adapter_id,
        details={
            "version": cleared,
            "canary_weight": weight,
            "active_version": version_name(active) if active is not None else None,
            **(note or {}),
        },
    )
    return st.describe()


def rollback(
    session: Session, adapter_id: str, *, actor: str, note: dict[str, Any] | None = None
) -> AdapterRecord:
    st = LockedAdapter(session, adapter_id)
    active = st.with_status("active")
    if active is not None and st.with_status("canary") is not None:
        cleared = st.clear_canary()  # during a canary: back to the active version alone
        record_change(
            session,
            actor=actor,
            action="adapter.rolled_back",
            subject_type="adapter",
            subject_id=adapter_id,
            details={
                "version": version_name(active.number),
                "from": cleared,
                "canary_cleared": cleared,
                **(note or {}),
            },
        )
        return st.describe()
    target = st.rollback_target(active) if active is not None else None
    if active is None or target is None:
        raise Conflict(f"adapter {adapter_id!r} has no version to roll back to", code="no_rollback_target")
    cleared = st.clear_canary()
    st.activate(target, retire=active)
    record_change(
        session,
        actor=actor,
        action="adapter.rolled_back",
        subject_type="adapter",
        subject_id=adapter_id,
        details={
            "version": version_name(target.number),
            "from": version_name(active.number),
            "canary_cleared": cleared,
            **(note or {}),
        },
    )
    return st.describe()


def disable_version(
    session: Session, adapter_id: str, version: str, *, actor: str, note: dict[str, Any] | None = None
) -> AdapterRecord:
    st = LockedAdapter(session, adapter_id)
    target = st.version(version)
    name = version_name(target.number)
    if target.status == "disabled":
        return st.describe()
    rolled_back_to = None
    canary_cleared = None
    was = target.status
    if was == "active":
        back = st.rollback_target(target)
        canary_cleared = st.clear_canary()
        if back is not None:
            st.activate(back, retire=target, retire_status="disabled")
            rolled_back_to = version_name(back.number)
        else:
            target.status = "disabled"
            st.adapter.active_version = None
            repo.flush(session)
    else:
        if was == "canary":
            st.adapter.canary_version = None
            st.adapter.canary_weight = None
        target.status = "disabled"
        repo.flush(session)
    record_change(
        session,
        actor=actor,
        action="version.disabled",
        subject_type="adapter",
        subject_id=adapter_id,
        details={"version": name, "previous_status": was, "rolled_back_to": rolled_back_to, **(note or {})},
    )
    if rolled_back_to is not None:  # the rollback it caused, findable as one (SPEC §19)
        record_change(
            session,
            actor=actor,
            action="adapter.rolled_back",
            subject_type="adapter",
            subject_id=adapter_id,
            details={
                "version": rolled_back_to,
                "from": name,
                "canary_cleared": canary_cleared,
                "cause": "version.disabled",
                **(note or {}),
            },
        )
    return st.describe()


def enable_version(
    session: Session, adapter_id: str, version: str, *, actor: str, note: dict[str, Any] | None = None
) -> AdapterRecord:
    """Take a ``disabled`` version back to ``ready`` (its quality gate as it was); 409 otherwise."""
    st = LockedAdapter(session, adapter_id)
    target = st.version(version)
    name = version_name(target.number)
    if target.status != "disabled":
        raise Conflict(
            f"version {name} of adapter {adapter_id!r} is {target.status}, not disabled",
            details={"version": name, "status": target.status},
        )
    target.status = "ready"
    repo.flush(session)
    record_change(
        session,
        actor=actor,
        action="version.enabled",
        subject_type="adapter",
        subject_id=adapter_id,
        details={"version": name, "quality_gate": target.quality_gate, **(note or {})},
    )
    return st.describe()


def set_adapter_enabled(
    session: Session, adapter_id: str, enabled: bool, *, actor: str, note: dict[str, Any] | None = None
) -> AdapterRecord:
    """The kill switch. Disabling keeps active/canary as they are, so enabling restores them."""
    st = LockedAdapter(session, adapter_id)
    want = "active" if enabled else "disabled"
    if st.adapter.status == want:
        return st.describe()
    st.adapter.status = want
    repo.flush(session)
    record_change(
        session,
        actor=actor,
        action="adapter.enabled" if enabled else "adapter.disabled",
        subject_type="adapter",
        subject_id=adapter_id,
        details={
            "active_version": version_name(st.adapter.active_version) if st.adapter.active_version else None,
            "canary_version": version_name(st.adapter.canary_version) if st.adapter.canary_version else None,
            **(note or {}),
        },
    )
    return st.describe()
