"""Prewarm: have a version on N healthy replicas now — the holders first, then placement's picks,
each loaded in the background through the normal (cluster-claimed, verified) load path.

A prewarm of a version this router's routing snapshot does not hold yet (the admin API created
and promoted it a moment ago; the change reaches the router within SPEC §4's second) is not an
error: :class:`PendingPrewarms` keeps it by adapter and version and the router carries it out as
soon as a snapshot has the version (dropped, with a warning, after ``PENDING_S``).
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field

from registry.snapshot import RoutingSnapshot, VersionInfo
from router.loader import Loader
from router.planner import Planner
from router.store import ReplicaStore

log = logging.getLogger("loraplane.router")


class Prewarmer:
    def __init__(self, store: ReplicaStore, planner: Planner, loader: Loader) -> None:
        self._store = store
        self._planner = planner
        self._loader = loader

    async def prewarm(
        self, info: VersionInfo, replicas: int, *, exclude: set[str] | frozenset[str], strict_hot: bool
    ) -> list[str]:
        """Have ``info`` on ``replicas`` healthy replicas: those that hold it, then placement's
        picks (never one in ``exclude``), each loaded in the background. ``strict_hot``: no load
        that would evict a copy another hot version needs (the reconciler's hot prewarm)."""
        name = info.lora_name
        reps = [r for r in self._store.for_base(info.base_model) if r.healthy]
        have = [
            r.url
            for r in reps
            if ((res := r.residents.get(name)) is not None and res.state != "failed")
            or self._loader.in_flight(r.url, name)
        ]
        targets = list(have[:replicas])
        excluded = set(have) | set(exclude)
        while len(targets) < replicas:
            got = self._planner.place_copy(info, reps, excluded, strict_hot=strict_hot)
            if got is None:
                break
            rep, decision = got
            excluded.add(rep.url)
            targets.append(rep.url)
            cands = self._planner.candidates(rep, decision, name, strict_hot=strict_hot)
            self._loader.start_load(rep, info, cands).add_done_callback(self._prewarm_done)
        return targets

    @staticmethod
    def _prewarm_done(task: asyncio.Task[None]) -> None:
        if not task.cancelled() and (exc := task.exception()) is not None:
            log.warning("prewarm failed", extra={"task": task.get_name(), "error": str(exc)})


PENDING_S = 60.0  # how long a prewarm waits for its version to reach this router's snapshot


@dataclass
class PendingPrewarms:
    """Prewarm requests for versions not in the routing snapshot yet: (adapter, version) → (how
    many replicas, deadline on the router's clock). A repeated request keeps the larger count."""

    ttl_s: float = PENDING_S
    _items: dict[tuple[str, str], tuple[int, float]] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self._items)

    def add(self, adapter_id: str, version: str, replicas: int, now: float) -> None:
        held = self._items.get((adapter_id, version))
        n = max(replicas, held[0]) if held is not None else replicas
        self._items[(adapter_id, version)] = (n, now + self.ttl_s)

    def take_ready(self, snapshot: RoutingSnapshot, now: float) -> list[tuple[VersionInfo, int]]:
        """The requests whose version ``snapshot`` holds (removed from here), and drop those past
        their deadline."""
        ready: list[tuple[VersionInfo, int]] = []
        for (adapter_id, version), (n, deadline) in list(self._items.items()):
            adapter = snapshot.adapters.get(adapter_id)
            info = adapter.versions.get(version) if adapter is not None else None
            if info is not None:
                ready.append((info, n))
            elif now <= deadline:
                continue
            else:
                log.warning(
                    "prewarm dropped: the version never reached this router's routing table",
                    extra={"adapter": adapter_id, "version": version, "waited_s": self.ttl_s},
                )
            del self._items[(adapter_id, version)]
        return ready
