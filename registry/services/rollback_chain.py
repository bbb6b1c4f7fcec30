"""The rollback chain (SPEC §13): which version a rollback restores, as a pure function of the
versions' ``(status, rollback_to)``, shared by the state machine
(:meth:`registry.services.lifecycle.LockedAdapter.rollback_target`, on locked rows) and the
console (:func:`rollback_refusal`, on a described adapter, to disable its Roll back button with
the reason the state machine would give)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from registry.services.records import AdapterRecord

K = TypeVar("K", int, str)


def rollback_step(start: K, link: Callable[[K], tuple[str, K | None] | None]) -> K | None:
    """The version a rollback from ``start`` restores: ``rollback_to`` followed, disabled versions
    skipped, cycle-safe; None when there is none. ``link(v)``: ``(status, rollback_to)`` of v."""
    seen = {start}
    here = link(start)
    nxt = here[1] if here is not None else None
    while nxt is not None and nxt not in seen:
        seen.add(nxt)
        found = link(nxt)
        if found is None:
            return None
        if found[0] != "disabled":
            return nxt
        nxt = found[1]
    return None


def rollback_refusal(rec: AdapterRecord) -> str | None:
    """Why :func:`rollback` would answer 409 ``no_rollback_target`` for the adapter as described,
    or None when it would run (the console disables its button with this reason)."""
    if rec.active_version is None:
        return "no active version: nothing to roll back from"
    if rec.canary_version is not None:
        return None  # rollback ends the canary
    by = {v.version: v for v in rec.versions or []}

    def link(name: str) -> tuple[str, str | None] | None:
        v = by.get(name)
        return (v.status, v.rollback_to) if v is not None else None

    if rollback_step(rec.active_version, link) is None:
        return f"nothing to roll back to: no version before {rec.active_version} that is not disabled"
    return None
