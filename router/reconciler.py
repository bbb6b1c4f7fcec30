"""Reconciler: keeps what replicas hold in line with the registry's routing snapshot.

Runs on every ``update_snapshot`` (kicked) and every ``reconcile_interval_s``. In every process:
load records stuck in ``staging``/``loading`` with no load in flight here are dropped, and the
hot set's copy targets are refreshed (placement reads them). Cluster-wide chores run in one
process at a time (the ``reconciler`` lease of ``router.cluster``):
- adapters that are disabled or gone, and versions that are disabled or gone, are unloaded
  at once (``reason`` ``disabled``);
- versions that no longer serve by default (``retired``, ``ready``) are unloaded once idle —
  no request in flight in any process and none routed there for ``retired_idle_unload_s``
  (pinned traffic keeps them) (``reason`` ``retired``);
- a replica holding more than ``max_adapters`` (left from before, or loaded by hand) is brought
  back to it, least recently used idle adapters first (``reason`` ``evict``);
- hot adapters (``router.hotness``; measured hot from the cluster's counts) are prewarmed up to
  their copy count, through placement with ``strict_hot`` (a prewarm never evicts another hot
  copy) and the normal load path — when the placement controller is off
  (``plan_interval_s`` = 0); otherwise the placement plan gives them their copies
  (``router.controller``). A replica where the version's load failed is not retried until its
  failed record expires.

Unloads go through ``Unloader.unload``, which is refused while any process has a request in
flight for the adapter there. Nothing is unloaded before the first snapshot arrives.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable

from registry.snapshot import RoutingSnapshot, VersionInfo
from router.cluster import Board, ClusterState
from router.hotness import HotSet
from router.loader import Loader
from router.prewarm import Prewarmer
from router.settings import RouterSettings
from router.store import ReplicaState, ReplicaStore, parse_lora_name
from router.unloader import Unloader

log = logging.getLogger("loraplane.router.reconciler")


class Reconciler:
    def __init__(
        self,
        settings: RouterSettings,
        store: ReplicaStore,
        loader: Loader,
        unloader: Unloader,
        cluster: ClusterState,
        hot: HotSet,
        prewarmer: Prewarmer,
        snapshot: Callable[[], RoutingSnapshot | None],
        board: Board,
        *,
        clock: Callable[[], float],
        wall: Callable[[], float] = time.time,
    ) -> None:
        self._settings = settings
        self._store = store
        self._loader = loader
        self._unloader = unloader
        self._cluster = cluster
        self._hot = hot
        self._prewarmer = prewarmer
        self._snapshot = snapshot
        self._board = board
        self._clock = clock
        self._wall = wall
        self._kick = asyncio.Event()
        self._short: set[str] = set()  # hot versions below their count (logged once until met)
        self.stopped = False

    def kick(self) -> None:
        self._kick.set()

    async def run(self) -> None:
        while not self.stopped:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._kick.wait(), self._settings.reconcile_interval_s)
            self._kick.clear()
            try:
                await self.reconcile_once()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("reconcile pass failed")

    async def reconcile_once(self) -> None:
        snap = self._snapshot()
        self._drop_stuck()
        if self._settings.hot_prewarm_rps > 0:
            await self._hot.measure(self._board, self._wall())
        hot = self._hot.refresh(snap)
        if snap is None or not await self._cluster.lead("reconciler"):
            return
        for rep in list(self._store.replicas.values()):
            if rep.healthy:
                await self._unload_unserved(rep, snap)
                await self._trim(rep)
        await self._unloader.drop_kept(lambda name: _serves(snap, name))
        if self._settings.plan_interval_s <= 0:
            await self._prewarm_hot(hot, snap)

    def _drop_stuck(self) -> None:
        now = self._clock()
        for rep in list(self._store.replicas.values()):
            for name, r in list(rep.residents.items()):
                if (
                    r.state in ("staging", "loading")
                    and not self._loader.in_flight(rep.url, name)
                    and now - r.since > self._settings.load_timeout_s + 5
                ):
                    rep.residents.pop(name, None)

    async def _unload_unserved(self, rep: ReplicaState, snap: RoutingSnapshot) -> None:
        now = self._clock()
        for name, r in list(rep.residents.items()):
            if r.state != "resident":
                continue
            adapter = snap.adapters.get(r.adapter_id)
            version = adapter.versions.get(r.version) if adapter else None
            reason: str | None = None
            if (
                adapter is None
                or adapter.status == "disabled"
                or version is None
                or version.status == "disabled"
                or version.lora_name != name
            ):
                reason = "disabled"
            elif (
                version.status not in ("active", "canary")
                and rep.in_use(name) == 0
                and now - r.last_used >= self._settings.retired_idle_unload_s
            ):
                reason = "retired"
            if reason is not None:
                await self._unloader.unload(rep, name, reason)

    async def _trim(self, rep: ReplicaState) -> None:
        # what the replica has registered: a load in progress is not yet (while a claim's victims
        # unload, their slots and the new one's both count: that is not an excess)
        present = [r for r in rep.residents.values() if r.state in ("resident", "unloading")]
        excess = len(present) - rep.pool.evict_bound
        if excess <= 0:
            return
        targets = self._hot.targets
        idle = sorted(
            (r for r in present if r.state == "resident" and rep.in_use(r.lora_name) == 0),
            key=lambda r: (r.lora_name in targets, r.last_used),
        )
        log.warning(
            "replica holds more adapters than max_adapters; evicting the excess",
            extra={"replica": rep.url, "held": len(present), "max_adapters": rep.pool.max_adapters},
        )
        for r in idle[:excess]:
            await self._unloader.unload(rep, r.lora_name, "evict")

    async def _prewarm_hot(self, hot: dict[str, VersionInfo], snap: RoutingSnapshot) -> None:
        short: list[tuple[VersionInfo, int, set[str]]] = []
        for name, info in hot.items():
            want = self._hot.targets[name]
            holders = 0
            failed: set[str] = set()
            for r in self._store.for_base(info.base_model):
                res = r.residents.get(name) if r.healthy else None
                if res is None:
                    continue
                if res.state == "failed":
                    failed.add(r.url)
                else:
                    holders += 1
            if holders < want:
                short.append((info, want, failed))
        self._short &= {info.lora_name for info, _, _ in short}
        for info, want, failed in short:
            level = logging.DEBUG if info.lora_name in self._short else logging.INFO
            self._short.add(info.lora_name)
            log.log(
                level,
                "prewarming hot adapter",
                extra={
                    "lora_name": info.lora_name,
                    "marked": self._hot.marked(snap, info),
                    "rate": round(self._hot.rates.get(info.lora_name, 0.0), 2),
                    "replicas": want,
                },
            )
            await self._prewarmer.prewarm(info, want, exclude=failed, strict_hot=True)


def _serves(snap: RoutingSnapshot, lora_name: str) -> bool:
    """``lora_name`` is the active or canary version of an enabled adapter in ``snap``."""
    parsed = parse_lora_name(lora_name)
    adapter = snap.adapters.get(parsed[0]) if parsed is not None else None
    version = adapter.versions.get(parsed[1]) if adapter is not None and parsed is not None else None
    return (
        adapter is not None
        and adapter.status != "disabled"
        and version is not None
        and version.lora_name == lora_name
        and version.status in ("active", "canary")
    )
