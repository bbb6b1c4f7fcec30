"""Claiming a load slot cluster-wide (``ClusterState.claim``), for the loader.

``reserve`` loops until this process owns the load of (replica, version) — ``Claim`` with the
victims to unload first — or another process has loaded it (None). Meanwhile: a replica or pool
at its cap of loads in flight (``busy``) queues the load, bounded by ``load_timeout_s``
(then 503 ``no_capacity``), in a fair queue: when a slot frees, the load of the tenant that
received the least service (the tenant of the request that started it) claims first, and
processes take turns at a replica's slots (``LoadCaps.turn_ttl_s``); another
process's load in progress is waited for; its failure since
we started, or a replica with no idle adapter to evict (``full``), is a ``LoadError``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence

from router.cluster import Claim, ClusterState, LoadCaps
from router.contract import NoCapacity
from router.errors import LoadError
from router.fairness import BACKGROUND, FairQueue, VirtualCounters, Waiter, current_tenant
from router.metrics import RouterMetrics
from router.settings import RouterSettings
from router.store import ReplicaState

POLL_S = 0.05  # how often a process waiting for another one's load looks at its record
# How long a process's registration as waiting for a replica's load slot lasts (each try renews
# it; a waiting process tries every POLL_S): while it lasts, the process that claimed that
# replica's last slot yields the next one to it (``LoadCaps.turn_ttl_s``).
TURN_TTL_S = 0.3


class SlotClaims:
    def __init__(
        self,
        settings: RouterSettings,
        cluster: ClusterState,
        metrics: RouterMetrics,
        *,
        clock: Callable[[], float],
        wall: Callable[[], float] = time.time,
        fair: FairQueue | None = None,
    ) -> None:
        self._settings = settings
        # loads waiting for a load slot (the caps), in fairness order (``router.fairness``)
        self._fair = fair if fair is not None else FairQueue(VirtualCounters(), poll_s=POLL_S)
        self._cluster = cluster
        self._metrics = metrics
        self._clock = clock
        self._wall = wall
        self._queued: set[tuple[str, str]] = set()  # loads waiting for a slot (LoadCaps)

    def queued(self, url: str, lora_name: str) -> bool:
        return (url, lora_name) in self._queued

    def unqueue(self, url: str, lora_name: str) -> None:
        self._queued.discard((url, lora_name))

    def _caps(self, rep: ReplicaState) -> LoadCaps:
        s = self._settings
        background = current_tenant() == BACKGROUND  # a prewarm or a planned load: no request waits
        return LoadCaps(s.max_loads_per_replica, s.max_loads_per_pool, rep.pool.name, TURN_TTL_S, background)

    async def reserve(self, rep: ReplicaState, name: str, candidates: Sequence[str]) -> Claim | None:
        """The claim that makes this process the loader (None: resident by another's load)."""
        since = self._wall()  # a failure recorded after this is the load we joined
        deadline = self._clock() + self._settings.load_timeout_s
        # the load's place in the queue for a load slot, as the tenant's of the request that started it
        waiter = self._fair.waiter(current_tenant(), rep.url)
        try:
            if self._fair.waiting:  # loads of this process wait for a slot: queue behind them
                await waiter.turn(deadline - self._clock())
            return await self._reserve(rep, name, candidates, since, deadline, waiter)
        finally:
            waiter.leave()

    async def _reserve(
        self,
        rep: ReplicaState,
        name: str,
        candidates: Sequence[str],
        since: float,
        deadline: float,
        waiter: Waiter,
    ) -> Claim | None:
        while True:
            claim = await self._cluster.claim(
                rep.url, name, rep.pool.evict_bound, candidates, since, self._caps(rep)
            )
            if claim.outcome == "reserved":
                self._queued.discard((rep.url, name))
                return claim
            if claim.outcome == "busy":  # at the replica's or pool's cap, or another process's turn
                if self._clock() > deadline:
                    cap = "replica" if claim.busy == "turn" else claim.busy
                    raise NoCapacity(
                        f"too many adapter loads in flight ({cap} cap); retry shortly",
                        retry_after=2,
                    )
                self._queued.add((rep.url, name))
                await waiter.turn(deadline - self._clock())  # False: the deadline passed: one last try
                continue
            waiter.leave()
            self._queued.discard((rep.url, name))
            rec = claim.record
            if claim.outcome == "failed" and rec is not None:
                raise LoadError(
                    f"load failed in another gateway process: {rec.reason}",
                    failure=rec.failure or "other",
                    retry_elsewhere=rec.retry_elsewhere,
                )
            if claim.outcome == "full":
                self._metrics.placement.labels(outcome="no_room").inc()
                raise LoadError(
                    f"no room on {rep.url}: every adapter there is in use",
                    failure="no_room",
                    retry_elsewhere=True,
                )
            if rec is not None and rec.state == "resident":
                return None
            if rec is not None and rec.pid == self._cluster.pid and rec.state in ("staging", "loading"):
                await self._cluster.drop(rep.url, name)  # left by an earlier attempt of ours: stale
                continue
            if self._clock() > deadline:
                raise LoadError(
                    "timed out waiting for another process's load", failure="timeout", retry_elsewhere=True
                )
            await asyncio.sleep(POLL_S)
