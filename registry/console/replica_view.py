"""What is loaded where, and where the placement plan wants it, from the admin app's
``ReplicaDirectory`` (the router's view)."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from registry.api.deps import AdminState

log = logging.getLogger("loraplane.registry.console")

STATES = ("resident", "loading", "staging", "unloading", "failed")


@dataclass(frozen=True, slots=True)
class Residency:
    ok: bool
    replicas: list[dict[str, Any]] = field(default_factory=list)
    problem: str | None = None

    def count_by_adapter(self) -> dict[str, int]:
        """Replicas where each adapter (any version) is resident."""
        out: dict[str, int] = {}
        for r in self.replicas:
            for a in {x["adapter"] for x in r.get("adapters", []) if x.get("state") == "resident"}:
                out[a] = out.get(a, 0) + 1
        return out

    def of_adapter(self, adapter_id: str) -> list[dict[str, Any]]:
        """(replica url, version, state) rows for one adapter."""
        return [
            {"replica": r["url"], "version": x.get("version"), "state": x.get("state")}
            for r in self.replicas
            for x in r.get("adapters", [])
            if x.get("adapter") == adapter_id
        ]

    def grid(self) -> tuple[list[str], dict[str, dict[str, str]]]:
        """Adapters loaded anywhere (sorted) and, per adapter, per replica url: ``"vN state"``."""
        cells: dict[str, dict[str, str]] = {}
        for r in self.replicas:
            for x in r.get("adapters", []):
                row = cells.setdefault(str(x.get("adapter")), {})
                text = f"{x.get('version')} {x.get('state')}"
                row[r["url"]] = f"{row[r['url']]}, {text}" if r["url"] in row else text
        return sorted(cells), cells


async def residency(st: AdminState) -> Residency:
    directory = st.replica_directory
    if directory is None:
        return Residency(ok=False, problem="no replica directory is attached to this admin API")
    try:
        records = await directory.list_replicas()
    except Exception as e:  # the directory is another component: say so on the page, never a 500
        log.warning("replica directory failed", extra={"error": str(e)})
        return Residency(ok=False, problem=f"the replica directory failed: {type(e).__name__}")
    return Residency(ok=True, replicas=sorted(records, key=lambda r: str(r.get("url"))))


@dataclass(frozen=True, slots=True)
class PlanView:
    ok: bool
    plan: dict[str, Any] = field(default_factory=dict)
    problem: str | None = None

    @property
    def published(self) -> bool:
        return bool(self.plan.get("published"))


async def placement(st: AdminState) -> PlanView:
    """The published placement plan (``ReplicaDirectory.plan``); a problem line, never a 500."""
    directory = st.replica_directory
    if directory is None:
        return PlanView(ok=False, problem="no replica directory is attached to this admin API")
    try:
        plan = await directory.plan()
    except Exception as e:  # the directory is another component: say so on the page, never a 500
        log.warning("placement plan unavailable", extra={"error": str(e)})
        return PlanView(ok=False, problem=f"the placement plan is unavailable: {type(e).__name__}")
    return PlanView(ok=True, plan=dict(plan))
