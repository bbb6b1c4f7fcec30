"""Keeps a gateway's ``/metrics`` bounded: a periodic sweep removes the label sets of adapter
versions that are gone or idle, in the gateway's request families (``gateway.metrics``) and the
router's per-version families (``router.metrics``), and the router's label sets of replicas that
left the pool.

The unit is the adapter version (``(adapter, version)``, every tenant, endpoint, code, replica
and result of it together): a version still served keeps all its label sets, so no counter of it
resets while it is in use, and per-version sums (the console's traffic page, ``sum by (adapter,
version)``) never drop while the version lives. A version's label sets go when

- it is no longer in the routing table (adapter deleted, version gone): at the next sweep;
- none of them moved for ``LORAPLANE_METRICS_SERIES_TTL_S`` (default 3600 s; 0 = never for this
  reason): no request answered for it in this gateway and no load, unload, cold wait or fallback
  recorded by its router.

The base model's and unresolved requests' label sets (adapter ``""``) are never gone, only idle.
A request for a dropped version later re-creates its label sets from zero (a counter reset that
Prometheus' ``rate()`` / ``increase()`` handle).

Nothing is added per request beyond the one flag ``GatewayMetrics.series()`` / ``count()`` set on
their cached entry; the router's families are compared by value at sweep time. A sweep runs every
``SWEEP_INTERVAL_S`` (60 s, or the TTL when shorter) on the event loop, so a version is removed
between TTL and TTL + one interval after its last use, never before.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from collections.abc import Set as AbstractSet
from dataclasses import dataclass

from gateway.metrics import GatewayMetrics, Version
from kit.aio import cancel_all
from registry.snapshot import RoutingSnapshot
from router.contract import RouterAPI
from router.core import Router
from router.metrics import RouterMetrics

log = logging.getLogger("loraplane.gateway.metrics")

SWEEP_INTERVAL_S = 60.0
MIN_INTERVAL_S = 1.0


@dataclass(frozen=True, slots=True)
class SweepResult:
    versions: int  # versions with label sets kept after this sweep
    gone: int  # versions dropped because the routing table no longer holds them
    idle: int  # versions dropped because none of their label sets moved for the TTL
    replicas: int  # replica label sets dropped (replicas that left the pool)


def gone_from(snapshot: RoutingSnapshot, version: Version) -> bool:
    """Whether ``version`` is no longer in ``snapshot`` (the base model's ``""`` never is)."""
    adapter_id, name = version
    if not adapter_id:
        return False
    adapter = snapshot.adapters.get(adapter_id)
    return adapter is None or name not in adapter.versions


class SeriesSweeper:
    """``sweep()`` once (tests drive it with an injected ``clock``), or ``start()`` the periodic
    task and ``await stop()`` it. ``snapshot`` is the routing table's current snapshot (None before
    the first load: nothing is then dropped as gone); ``replicas`` the router's replica URLs (None
    while unknown: no replica label set is dropped)."""

    def __init__(
        self,
        metrics: GatewayMetrics,
        *,
        ttl_s: float,
        snapshot: Callable[[], RoutingSnapshot | None],
        router_metrics: RouterMetrics | None = None,
        replicas: Callable[[], AbstractSet[str] | None] | None = None,
        clock: Callable[[], float] = time.monotonic,
        interval_s: float | None = None,
    ) -> None:
        if ttl_s < 0:
            raise ValueError("ttl_s must be >= 0")
        self.metrics = metrics
        self.router_metrics = router_metrics
        self.ttl_s = ttl_s
        self._snapshot = snapshot
        self._replicas = replicas
        self._clock = clock
        if interval_s is None:
            interval_s = max(MIN_INTERVAL_S, min(SWEEP_INTERVAL_S, ttl_s)) if ttl_s > 0 else SWEEP_INTERVAL_S
        self.interval_s = interval_s
        self._last: dict[Version, float] = {}  # version → sweep time that last saw it move
        self._task: asyncio.Task[None] | None = None

    def sweep(self) -> SweepResult:
        now = self._clock()
        present, touched = self.metrics.take_touched()
        rm = self.router_metrics
        if rm is not None:
            r_present, r_touched = rm.take_touched()
            present |= r_present
            touched |= r_touched
        last = {v: now if v in touched else self._last.get(v, now) for v in present}
        snap = self._snapshot()
        gone = {v for v in present if gone_from(snap, v)} if snap is not None else set()
        idle = (
            {v for v, t in last.items() if now - t >= self.ttl_s and v not in gone}
            if self.ttl_s > 0
            else set()
        )
        drop = gone | idle
        if drop:
            self.metrics.drop_versions(drop)
            if rm is not None:
                rm.drop_versions(drop)
        replicas = 0
        keep = self._replicas() if self._replicas is not None else None
        if rm is not None and keep is not None:
            replicas = rm.drop_replicas(keep)
        self._last = {v: t for v, t in last.items() if v not in drop}
        return SweepResult(versions=len(self._last), gone=len(gone), idle=len(idle), replicas=replicas)

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            try:
                res = self.sweep()
            except Exception:  # a sweep must never end the task: the next one retries
                log.exception("metrics sweep failed")
                continue
            if res.gone or res.idle or res.replicas:
                log.info(
                    "metrics label sets removed",
                    extra={
                        "gone": res.gone,
                        "idle": res.idle,
                        "replicas": res.replicas,
                        "kept": res.versions,
                    },
                )

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self.run(), name="metrics-sweep")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            await cancel_all([task])


def sweeper_for(
    metrics: GatewayMetrics,
    router: RouterAPI,
    snapshot: Callable[[], RoutingSnapshot | None],
    ttl_s: float,
) -> SeriesSweeper:
    """The sweeper of a gateway: with ``router.core.Router`` its per-version and per-replica
    families too (another ``RouterAPI``, e.g. a test's fake, has none)."""
    if not isinstance(router, Router):
        return SeriesSweeper(metrics, ttl_s=ttl_s, snapshot=snapshot)
    real = router

    def replicas() -> AbstractSet[str] | None:
        try:
            return real.store.replicas.keys()
        except RuntimeError:  # not started (or stopped): the pool is unknown
            return None

    return SeriesSweeper(
        metrics, ttl_s=ttl_s, snapshot=snapshot, router_metrics=real.metrics, replicas=replicas
    )
