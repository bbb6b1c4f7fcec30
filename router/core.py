"""The router runtime: ``Router`` wires the parts together and runs the request loop.

Per request (``forward``): the planner's decision (``router.planner``) → an in-flight mark on
(replica, version) in the cluster state (refused while another process unloads it there) →
the loader's singleflight verified load if needed (``router.loader``, evicting the decision's
victims first) → the sender (``router.sender``) through the pool's engine driver. One retry on
another replica after a load failure that may succeed elsewhere or an error before the first
byte. State shared with other gateway processes lives behind ``router.cluster``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

import aiohttp
import redis.asyncio as aioredis
from prometheus_client import CollectorRegistry

from kit.aio import cancel_all
from registry.audit_sink import AuditSink
from registry.replicas import ReplicaDirectory
from registry.snapshot import RoutingSnapshot, VersionInfo
from router.audit import RouterAudit
from router.claims import POLL_S as CLAIM_POLL_S
from router.cluster import ClusterState
from router.contract import (
    AdapterLoadFailed,
    ForwardRequest,
    ForwardResult,
    NoCapacity,
)
from router.controller import PlanController
from router.directory import DirectoryPublisher, LocalReplicaDirectory
from router.drivers import EngineDriver, ModelsInfo
from router.fairness import FairQueue, VirtualCounters
from router.fallback import Fallback
from router.hotness import HotSet
from router.loader import Loader
from router.metrics import router_metrics
from router.placement.types import Profile
from router.planner import Planner
from router.prewarm import PendingPrewarms, Prewarmer
from router.reconciler import Reconciler
from router.requests import COLD_SLOT_RETRY_S, RequestLoop
from router.sender import Sender
from router.settings import RouterSettings
from router.shared_view import SharedView
from router.stagers import make_stagers
from router.staging import ReadableStore
from router.store import ReplicaState, ReplicaStore, parse_lora_name
from router.unloader import Unloader
from router.wiring import cluster_and_board, open_drivers, started

log = logging.getLogger("loraplane.router")


class Router:
    """One per gateway process; implements ``router.contract.RouterAPI``."""

    def __init__(
        self,
        settings: RouterSettings,
        *,
        store: ReadableStore,
        audit: AuditSink,
        redis: aioredis.Redis | None = None,
        cluster: ClusterState | None = None,
        clock: Callable[[], float] = time.monotonic,
        registry: CollectorRegistry | None = None,
        profile: Profile | None = None,
    ) -> None:
        self.settings = settings
        self._artifacts = store
        self._redis = redis
        self._clock = clock
        self.metrics = router_metrics(registry)
        if profile is None:
            from router.placement import profile_from_config

            profile = profile_from_config(settings.placement_profile, settings.placement_params)
        self.profile: Profile = profile
        self.cluster, self.board = cluster_and_board(settings, redis, cluster)
        self.controller: PlanController | None = None
        self.snapshot: RoutingSnapshot | None = None
        self._session: aiohttp.ClientSession | None = None
        self._drivers: dict[str, EngineDriver] = {}
        self._store: ReplicaStore | None = None
        self._loader: Loader | None = None
        self._unloader: Unloader | None = None
        self._reconciler: Reconciler | None = None
        self.shared_view: SharedView | None = None
        self._planner: Planner | None = None
        self._events = RouterAudit(audit, registry)
        self._fallback = Fallback(self.metrics, self._events, lambda: self.snapshot, clock=clock)
        self._requests: RequestLoop | None = None
        self._pending = PendingPrewarms()  # prewarms waiting for their version's snapshot
        self._tasks: list[asyncio.Task[None]] = []
        self._bg: set[asyncio.Task[Any]] = set()
        self._fair_queues: list[FairQueue] = []  # requests / loads waiting for a slot (router.fairness)

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        s = self.settings
        session, drivers = open_drivers(s)
        self._session, self._drivers = session, drivers
        store = self._store = ReplicaStore(
            s, drivers, clock=self._clock, wall=time.time, metrics=self.metrics, on_poll=self._on_poll
        )
        sender = Sender(
            self._events, self.metrics, store, ttfb_s=s.upstream_ttfb_timeout_s, clock=self._clock
        )
        stagers = make_stagers(s, self._artifacts, session)
        unloader = self._unloader = Unloader(s, store, stagers, self._events, self.metrics, self.cluster)
        hot = HotSet(s, store, clock=self._clock)
        # what each tenant was served, shared by the queues for cold slots and for load slots
        counters = VirtualCounters(s.fairness_weights)
        loader = self._loader = Loader(
            s,
            store,
            stagers,
            self._events,
            self.metrics,
            self.cluster,
            unloader,
            clock=self._clock,
            is_hot=lambda name: name in hot.targets,
            fair=self._queue(counters, CLAIM_POLL_S),
        )
        planner = self._planner = Planner(store, self.profile, hot, self.metrics, clock=self._clock)
        self._requests = RequestLoop(
            store,
            planner,
            self.cluster,
            loader,
            sender,
            hot,
            load_timeout_s=s.load_timeout_s,
            clock=self._clock,
            fair=self._queue(counters, COLD_SLOT_RETRY_S),
        )
        self.prewarmer = Prewarmer(store, planner, loader)
        self._reconciler = Reconciler(
            s,
            store,
            loader,
            unloader,
            self.cluster,
            hot,
            self.prewarmer,
            lambda: self.snapshot,
            self.board,
            clock=self._clock,
        )
        self.controller = PlanController(
            s,
            store,
            planner,
            loader,
            unloader,
            self.board,
            self.cluster,
            hot,
            lambda: self.snapshot,
            self.metrics,
            clock=self._clock,
            wall=time.time,
        )
        await self.cluster.start()
        await store.start()
        self._run(self._reconciler.run(), "reconciler")
        self._run(self.controller.run(), "placement-controller")
        if self._redis is not None:
            self.shared_view = SharedView(
                store, self.cluster, busy=loader.busy, clock=self._clock, interval_s=s.cluster_sync_s
            )
            await self.shared_view.sync_once()
            self._run(self.shared_view.run(), "cluster-sync")
            pub = DirectoryPublisher(
                self, self._redis, s.redis_prefix, interval_s=s.publish_interval_s, ttl_s=s.state_ttl_s
            )
            self._run(pub.publish_loop(), "publish")
            self._run(pub.prewarm_loop(), "prewarm")

    def _queue(self, counters: VirtualCounters, poll_s: float) -> FairQueue:
        q = FairQueue(counters, self.settings.fairness, poll_s=poll_s)
        self._fair_queues.append(q)
        return q

    def _run(self, coro: Any, name: str) -> None:
        self._tasks.append(asyncio.create_task(coro, name=name))

    async def stop(self) -> None:
        if self._reconciler is not None:
            self._reconciler.stopped = True
        if self.controller is not None:
            self.controller.stopped = True
        await cancel_all([*self._tasks, *self._bg])
        self._tasks.clear()
        if self._loader is not None:
            await self._loader.stop()
        for q in self._fair_queues:
            await q.stop()
        if self._store is not None:
            await self._store.stop()
        await self.cluster.stop()
        for driver in self._drivers.values():
            await driver.aclose()
        if self._session is not None:
            await self._session.close()
            self._session = None

    # ------------------------------------------------------------------ state for others

    @property
    def store(self) -> ReplicaStore:
        return started(self._store)

    @property
    def loader(self) -> Loader:
        return started(self._loader)

    @property
    def unloader(self) -> Unloader:
        return started(self._unloader)

    @property
    def planner(self) -> Planner:
        return started(self._planner)

    def ready(self) -> bool:
        """At least one replica in rotation."""
        return self.healthy_count() > 0

    def healthy_count(self, base_model: str | None = None) -> int:
        return 0 if self._store is None else self._store.healthy_count(base_model)

    def is_resident(self, lora_name: str) -> bool:
        if self._store is None:
            return False
        for rep in self._store.replicas.values():
            r = rep.residents.get(lora_name) if rep.healthy else None
            if r is not None and r.state == "resident":
                return True
        return False

    @property
    def directory(self) -> ReplicaDirectory:
        return LocalReplicaDirectory(self, self.board)

    def replica_records(self) -> list[dict[str, Any]]:
        return [] if self._store is None else [self._store.record(r) for r in self._store.replicas.values()]

    def update_snapshot(self, snapshot: RoutingSnapshot) -> None:
        """Called on every registry revision; the reconciler acts on it within moments, and the
        prewarms that waited for a version of it start."""
        self.snapshot = snapshot
        if self._reconciler is not None:
            self._reconciler.kick()
        if self._pending and self._requests is not None:
            for info, n in self._pending.take_ready(snapshot, self._clock()):
                self._spawn(self.prewarmer.prewarm(info, n, exclude=frozenset(), strict_hot=False))

    def _on_poll(self, rep: ReplicaState, models: ModelsInfo | None) -> None:
        if models is None or not rep.driver.capabilities.lists_adapters:
            return  # an advisory ledger is not what the replica lists
        ours = [n for n in models.adapters if parse_lora_name(n) is not None]
        self._spawn(self.cluster.sync_models(rep.url, ours, rep.poll_started_wall))

    def _spawn(self, coro: Any) -> None:
        task = asyncio.create_task(coro)
        self._bg.add(task)
        task.add_done_callback(self._bg.discard)

    # ------------------------------------------------------------------ forwarding

    async def forward(self, req: ForwardRequest) -> ForwardResult:
        requests = started(self._requests)
        try:
            return await requests.forward(req)
        except (AdapterLoadFailed, NoCapacity) as exc:
            if req.version is None or req.pinned:
                raise
            return await self._fallback.serve(req, exc, requests.forward)

    # ------------------------------------------------------------------ prewarm

    def find_version(self, adapter_id: str, version: str) -> VersionInfo | None:
        snap = self.snapshot
        adapter = snap.adapters.get(adapter_id) if snap is not None else None
        return adapter.versions.get(version) if adapter else None

    async def request_prewarm(self, adapter_id: str, version: str, replicas: int) -> dict[str, Any]:
        """Start loading ``adapter_id``/``version`` onto ``replicas`` healthy replicas (in the
        background); a version not in the routing snapshot yet is prewarmed once it is there
        (``pending``: the registry wrote it a moment ago, router.prewarm.PendingPrewarms)."""
        info = self.find_version(adapter_id, version)
        if info is None:
            self._pending.add(adapter_id, version, replicas, self._clock())
            log.info(
                "prewarm waits for the version to reach the routing table",
                extra={"adapter": adapter_id, "version": version, "replicas": replicas},
            )
            return {"adapter_id": adapter_id, "version": version, "replicas": replicas, "pending": True}
        targets = await self.prewarmer.prewarm(info, replicas, exclude=frozenset(), strict_hot=False)
        return {
            "adapter_id": adapter_id,
            "version": version,
            "lora_name": info.lora_name,
            "replicas": targets,
        }
