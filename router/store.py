"""Replica store: every replica of every pool, their poll loops, and readers for the runtime.

The per-replica state and its residency facts are ``router.replica``; the poll loops and the
reconciliation with ``/v1/models`` are ``router.poller``; passive outlier detection is
``router.outliers``. Readers get copies (``ReplicaView``s), never the mutable state.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as _dt
import logging
import socket
from collections.abc import Callable
from typing import Any

from kit.aio import cancel_all
from router.drivers import EngineDriver, ModelsInfo
from router.metrics import RouterMetrics
from router.outliers import Outliers
from router.poller import Poller
from router.replica import ReplicaState, parse_lora_name, views
from router.settings import PoolConfig, RouterSettings

__all__ = ["ReplicaState", "ReplicaStore", "parse_lora_name", "views"]

log = logging.getLogger("loraplane.router.store")


class ReplicaStore:
    """Knows every replica of every pool; runs their poll loops (``router.poller``)."""

    def __init__(
        self,
        settings: RouterSettings,
        drivers: dict[str, EngineDriver],
        *,
        clock: Callable[[], float],
        wall: Callable[[], float],
        metrics: RouterMetrics,
        on_poll: Callable[[ReplicaState, ModelsInfo | None], None] | None = None,
    ) -> None:
        self._settings = settings
        self._drivers = drivers
        self._clock = clock
        self._metrics = metrics
        self.replicas: dict[str, ReplicaState] = {}
        self.outliers = Outliers(settings, clock=clock, on_health=self.health_changed)
        self.poller = Poller(self, settings, clock=clock, wall=wall, on_poll=on_poll)
        # urls of the replicas whose placement view changed (or that were added or removed) since
        # the last take_changes(): the planner's replica tables re-index only those.
        self.changes: set[str] = set()
        # lora_name → requests routed to it, all replicas (kept across evictions: the evictor's
        # frequency); every ReplicaState shares this dict
        self.asked: dict[str, int] = {}
        self._seq = 0
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._dns_tasks: list[asyncio.Task[None]] = []
        # (url, lora_name) → when it was unloaded or found missing there (see ``note_gone``)
        self._gone: dict[tuple[str, str], float] = {}
        self._stopped = False

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        for pool in self._settings.pools:
            for url in pool.urls:
                self.add(url, pool)
            if pool.dns:
                await self._resolve_pool(pool)
                self._dns_tasks.append(asyncio.create_task(self._dns_loop(pool), name=f"dns:{pool.name}"))
        # Wait (bounded) for the first poll of every replica so the router starts warm.
        waits = [r.polled.wait() for r in self.replicas.values()]
        if waits:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.gather(*waits), self._settings.poll_timeout_s + 0.5)

    async def stop(self) -> None:
        self._stopped = self.poller.stopped = True
        await cancel_all([*self._tasks.values(), *self._dns_tasks])
        self._tasks.clear()
        self._dns_tasks.clear()

    def add(self, url: str, pool: PoolConfig, *, poll: bool = True) -> ReplicaState:
        """Add a replica (``poll=False``: no poll loop, for benchmarks and tests)."""
        url = url.rstrip("/")
        if url in self.replicas:
            return self.replicas[url]
        rep = ReplicaState(url=url, pool=pool, driver=self._drivers[pool.name])
        rep.asked = self.asked
        self._seq += 1
        rep.seq = self._seq  # the order of store.replicas (a url added again goes last)
        rep.feed = self.changes
        self.replicas[url] = rep
        self.changes.add(url)
        if poll and not self._stopped:
            self._tasks[url] = asyncio.create_task(self.poller.loop(rep), name=f"poll:{url}")
        log.info("replica added", extra={"replica": url, "pool": pool.name})
        return rep

    def remove(self, url: str) -> None:
        rep = self.replicas.pop(url, None)
        if rep is not None:
            rep.feed = None
            self.changes.add(url)
        task = self._tasks.pop(url, None)
        if task:
            task.cancel()
        if rep:
            log.info("replica removed", extra={"replica": url, "pool": rep.pool.name})
            self.health_changed(rep.pool.name)

    async def _resolve_pool(self, pool: PoolConfig) -> None:
        assert pool.dns
        host, _, port_s = pool.dns.rpartition(":")
        port = int(port_s)
        try:
            infos = await asyncio.get_running_loop().getaddrinfo(
                host, port, family=socket.AF_INET, type=socket.SOCK_STREAM
            )
        except OSError as exc:
            log.warning(
                "dns resolution failed", extra={"pool": pool.name, "dns": pool.dns, "error": str(exc)}
            )
            return
        wanted = {f"http://{info[4][0]}:{port}" for info in infos}
        current = {u for u, r in self.replicas.items() if r.pool.name == pool.name}
        for url in sorted(wanted - current):
            self.add(url, pool)
        for url in sorted(current - wanted):
            self.remove(url)

    async def _dns_loop(self, pool: PoolConfig) -> None:
        while not self._stopped:
            await asyncio.sleep(pool.dns_interval_s)
            await self._resolve_pool(pool)

    # ------------------------------------------------------------------ what happened

    async def poll_once(self, rep: ReplicaState) -> None:
        await self.poller.poll_once(rep)

    def reconcile(self, rep: ReplicaState, models: ModelsInfo, asked_at: float | None = None) -> None:
        self.poller.reconcile(rep, models, asked_at)

    def note_gone(self, rep: ReplicaState, lora_name: str) -> None:
        """``lora_name`` left ``rep`` (unloaded, or the replica said it does not know it): a poll
        answer asked before now must not bring it back as resident (it may predate the unload)."""
        now = self._clock()
        self._gone[(rep.url, lora_name)] = now
        if len(self._gone) > 4096:
            self._gone = {k: t for k, t in self._gone.items() if now - t < 120.0}

    def gone_after(self, url: str, lora_name: str, asked: float) -> bool:
        return self._gone.get((url, lora_name), float("-inf")) >= asked

    def mark_failure(self, rep: ReplicaState, error: str, *, immediate: bool = False) -> None:
        self.outliers.mark_failure(rep, error, immediate=immediate)

    def note_success(self, rep: ReplicaState) -> None:
        self.outliers.note_success(rep)

    def note_failure(self, rep: ReplicaState, error: str, model: str | None = None) -> None:
        self.outliers.note_failure(rep, error, model)

    def note_load(self, rep: ReplicaState, model: str, *, ok: bool, error: str = "") -> None:
        self.outliers.note_load(rep, model, ok=ok, error=error)

    def load_targets(self, reps: list[ReplicaState], lora_name: str) -> list[ReplicaState]:
        return self.outliers.load_targets(reps, lora_name)

    def load_exclusions(self, base_model: str, lora_name: str, excluded: set[str]) -> set[str]:
        """``excluded`` plus the healthy replicas of ``base_model`` whose loads are paused for
        ``lora_name`` (``excluded`` itself when there are none)."""
        if self._clock() >= self.outliers.loads_paused_until:
            return excluded
        reps = [r for r in self.for_base(base_model) if r.healthy and r.url not in excluded]
        keep = {r.url for r in self.load_targets(reps, lora_name)}
        paused = {r.url for r in reps if r.url not in keep}
        return excluded | paused if paused else excluded

    def health_changed(self, pool: str) -> None:
        n = sum(1 for r in self.replicas.values() if r.pool.name == pool and r.healthy)
        self._metrics.replicas_healthy.labels(pool=pool).set(n)

    # ------------------------------------------------------------------ readers

    def for_base(self, base_model: str) -> list[ReplicaState]:
        return [r for r in self.replicas.values() if r.pool.base_model == base_model]

    def serves(self, base_model: str) -> bool:
        """Whether any replica serves ``base_model`` (stops at the first: no list per request)."""
        return any(r.pool.base_model == base_model for r in self.replicas.values())

    def pools_for(self, base_model: str) -> list[PoolConfig]:
        """The configured pools serving ``base_model``."""
        return [p for p in self._settings.pools if p.base_model == base_model]

    def take_changes(self) -> set[str]:
        """The urls in ``changes`` (emptied): replicas added, removed or with a new view since."""
        out = set(self.changes)
        self.changes.clear()
        return out

    def healthy_count(self, base_model: str | None = None) -> int:
        return sum(
            1
            for r in self.replicas.values()
            if r.healthy and (base_model is None or r.pool.base_model == base_model)
        )

    def record(self, rep: ReplicaState) -> dict[str, Any]:
        """The replica record of SPEC §13."""
        wall = rep.last_seen_wall
        last_seen = (
            _dt.datetime.fromtimestamp(wall, tz=_dt.UTC).isoformat().replace("+00:00", "Z") if wall else None
        )
        return {
            "url": rep.url,
            "pool": rep.pool.name,
            "base_model": rep.pool.base_model,
            "healthy": rep.healthy,
            "adapters": [
                {"adapter": r.adapter_id, "version": r.version, "lora_name": r.lora_name, "state": r.state}
                for r in rep.residents.values()
            ],
            "running": rep.metrics.running,
            "waiting": rep.metrics.waiting,
            "inflight": rep.inflight,
            "last_seen": last_seen,
        }
