"""The placement controller: forecast demand, plan where adapters go, load them before demand.

Every process, every ``flush_s`` (1 s): adds the requests it routed per lora_name to the
cluster's demand board (``router.cluster.board``). Every ``plan_interval_s`` (settings; 0 turns
the controller off):

- **the chore leader** (``ClusterState.lead("planner")``, one process in the cluster) reads the
  board's counts since its last plan — every gateway's requests — folds them into the forecast
  (``router.placement.forecast``), makes the plan (``router.placement.plan.make_plan``, a pure
  function of the replica tables, the demands and the previous plan), publishes it on the
  board, and executes its actions: loads of planned copies that are missing (at most
  ``max_loads_per_pool`` per pool and plan, through placement with ``strict_hot`` — never
  evicting a hot or planned copy — and the normal cluster-claimed, verified load path), and
  unloads of idle copies the plan moved away;
- **every other process** reads the published plan.

Everyone then applies it: the planner's ``plan`` (the default policy prefers planned replicas,
evictors keep planned copies) and the gauges ``loraplane_pool_desired_replicas``,
``loraplane_adapter_demand_rps`` and ``loraplane_adapter_planned_replicas``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections.abc import Callable

import orjson

from registry.snapshot import RoutingSnapshot, VersionInfo
from router.cluster import Board, ClusterState
from router.hotness import HotSet
from router.loader import Loader
from router.metrics import RouterMetrics
from router.placement.forecast import Forecaster
from router.placement.plan import Demand, Plan, PlanAction, PlanParams, actions, make_plan
from router.planner import Planner
from router.replica import parse_lora_name
from router.settings import RouterSettings
from router.store import ReplicaStore
from router.unloader import Unloader

log = logging.getLogger("loraplane.router.controller")

FLUSH_S = 1.0


class PlanController:
    def __init__(
        self,
        settings: RouterSettings,
        store: ReplicaStore,
        planner: Planner,
        loader: Loader,
        unloader: Unloader,
        board: Board,
        cluster: ClusterState,
        hot: HotSet,
        snapshot: Callable[[], RoutingSnapshot | None],
        metrics: RouterMetrics,
        *,
        clock: Callable[[], float],
        wall: Callable[[], float],
    ) -> None:
        self._settings = settings
        self._store = store
        self._planner = planner
        self._loader = loader
        self._unloader = unloader
        self._board = board
        self._cluster = cluster
        self._hot = hot
        self._snapshot = snapshot
        self._metrics = metrics
        self._clock = clock
        self._wall = wall
        self.params = PlanParams(**settings.plan_params)
        self.forecaster = Forecaster()
        self.plan: Plan | None = None
        self.leading = False
        self._last_bucket: int | None = None
        self._last_plan = -math.inf
        self._labels: set[tuple[str, str]] = set()
        self._bg: set[asyncio.Task[None]] = set()
        self.stopped = False

    async def run(self) -> None:
        while not self.stopped:
            try:
                await self.tick()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("placement controller tick failed")
            await asyncio.sleep(FLUSH_S)

    async def tick(self, *, force: bool = False) -> None:
        """Flush this process's counts; plan (leader) or read the plan (others) when it is time."""
        await self._board.add(self._hot.take_pending(), self._wall())
        interval = self._settings.plan_interval_s
        if interval <= 0:
            return
        now = self._clock()
        if not force and now - self._last_plan < interval:
            return
        self._last_plan = now
        self.leading = await self._cluster.lead("planner")
        if self.leading:
            await self._lead()
        else:
            raw = await self._board.get_plan()
            if raw is not None:
                with contextlib.suppress(
                    ValueError, TypeError, KeyError, AssertionError, orjson.JSONDecodeError
                ):
                    self._apply(Plan.from_json(orjson.loads(raw)))

    async def _lead(self) -> None:
        board = self._board
        wall = self._wall()
        last = board.bucket(wall)
        span = max(1, round(self._settings.plan_interval_s / board.bucket_s))
        first = (
            self._last_bucket if self._last_bucket is not None and self._last_bucket < last else last - span
        )
        counts = await board.counts(first, last)
        self._last_bucket = last
        rates = self.forecaster.observe(counts, (last - first) * board.bucket_s)
        snap = self._snapshot()
        demands, infos = self.demands(rates, snap)
        bases = {p.base_model for p in self._settings.pools}
        tables = {b: self._planner.table(b) for b in sorted(bases)}
        previous = self.plan
        plan = make_plan(tables, demands, previous, self.params, wall)
        ttl = max(5.0 * self._settings.plan_interval_s, 10.0)
        await board.put_plan(orjson.dumps(plan.to_json()), ttl)
        self._apply(plan)
        await self._execute(actions(plan, tables, previous), infos)

    def demands(
        self, rates: dict[str, float], snap: RoutingSnapshot | None
    ) -> tuple[list[Demand], dict[str, VersionInfo]]:
        """The forecast rates (and hot adapters) as ``Demand``s of serveable versions."""
        infos: dict[str, VersionInfo] = {}
        if snap is None:
            return [], infos
        hot = dict(self._hot.targets)
        threshold = self._settings.hot_prewarm_rps
        if threshold > 0:  # measured hot from the cluster-wide forecast (issue 24.11)
            for name, rate in rates.items():
                if rate >= threshold:
                    hot[name] = max(hot.get(name, 0), self._settings.hot_prewarm_replicas)
        out: list[Demand] = []
        for name in sorted(rates.keys() | hot.keys()):
            parsed = parse_lora_name(name)
            adapter = snap.adapters.get(parsed[0]) if parsed else None
            info = adapter.versions.get(parsed[1]) if adapter is not None and parsed else None
            if adapter is None or info is None or info.lora_name != name:
                continue
            if adapter.status == "disabled" or info.status not in ("active", "canary", "ready", "retired"):
                continue
            if info.status in ("ready", "retired") and name not in hot and rates.get(name, 0.0) <= 0:
                continue
            infos[name] = info
            inflight = sum(r.in_use(name) for r in self._store.for_base(info.base_model))
            out.append(
                Demand(
                    lora_name=name,
                    adapter_id=info.adapter_id,
                    version=info.version,
                    base_model=info.base_model,
                    rate=rates.get(name, 0.0),
                    inflight=inflight,
                    min_copies=hot.get(name, 0),
                    size_bytes=info.total_bytes,
                    rank=info.rank,
                )
            )
        return out, infos

    def _apply(self, plan: Plan) -> None:
        self.plan = plan
        self._planner.plan = plan.targets
        m = self._metrics
        for pool, n in plan.desired.items():
            m.desired_replicas.labels(pool=pool).set(n)
        labels: set[tuple[str, str]] = set()
        for name, (adapter, version) in plan.adapters.items():
            labels.add((adapter, version))
            m.demand.labels(adapter=adapter, version=version).set(plan.demand.get(name, 0.0))
            m.planned.labels(adapter=adapter, version=version).set(len(plan.targets.get(name, ())))
        for adapter, version in self._labels - labels:
            with contextlib.suppress(KeyError):
                m.demand.remove(adapter, version)
                m.planned.remove(adapter, version)
        self._labels = labels

    async def _execute(self, todo: list[PlanAction], infos: dict[str, VersionInfo]) -> None:
        per_pool: dict[str, int] = {}
        cap = self._settings.max_loads_per_pool or 4
        for act in todo:
            rep = self._store.replicas.get(act.url)
            info = infos.get(act.lora_name)
            if rep is None or not rep.healthy or info is None:
                continue
            if act.kind == "unload":
                if await self._unloader.unload(rep, act.lora_name, "plan"):
                    self._metrics.plan_actions.labels(action="unload").inc()
                continue
            if self._loader.in_flight(rep.url, act.lora_name) or per_pool.get(rep.pool.name, 0) >= cap:
                continue
            got = self._planner.place_copy(info, [rep], set(), strict_hot=True)
            if got is None:
                self._metrics.plan_actions.labels(action="skipped").inc()
                continue
            _, decision = got
            per_pool[rep.pool.name] = per_pool.get(rep.pool.name, 0) + 1
            cands = self._planner.candidates(rep, decision, act.lora_name, strict_hot=True)
            task = self._loader.start_load(rep, info, cands)
            self._bg.add(task)
            task.add_done_callback(self._done)
            self._metrics.plan_actions.labels(action="load").inc()
            log.info("loading ahead of demand", extra={"replica": rep.url, "lora_name": act.lora_name})

    def _done(self, task: asyncio.Task[None]) -> None:
        self._bg.discard(task)
        if not task.cancelled() and (exc := task.exception()) is not None:
            log.warning("planned load failed", extra={"task": task.get_name(), "error": str(exc)})
