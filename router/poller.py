"""One poll loop per replica (``/health``, ``/v1/models``, ``/metrics`` under one timeout) and
the reconciliation of residency with what the replica lists (DESIGN.md example 9).

After ``unhealthy_after`` failed polls a replica leaves rotation; one good poll brings it back
(not before the end of an outlier ejection). Only transitions are logged. Every good poll
aligns the residency facts with ``/v1/models``: a resident adapter missing there (the replica
restarted) is dropped; an unknown lora_name that is ours (``ADAPTER@vN-sha8``) is adopted as
resident (another gateway process loaded it).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Protocol

from router.drivers import DriverError, MetricsSample, ModelsInfo
from router.outliers import Outliers
from router.placement.types import Residency
from router.replica import ReplicaState, parse_lora_name
from router.settings import RouterSettings

log = logging.getLogger("loraplane.router.store")


class PollOwner(Protocol):
    """What the poller needs of its store."""

    replicas: dict[str, ReplicaState]
    outliers: Outliers

    def gone_after(self, url: str, lora_name: str, asked: float) -> bool: ...

    def health_changed(self, pool: str) -> None: ...


class Poller:
    def __init__(
        self,
        store: PollOwner,
        settings: RouterSettings,
        *,
        clock: Callable[[], float],
        wall: Callable[[], float],
        on_poll: Callable[[ReplicaState, ModelsInfo | None], None] | None = None,
    ) -> None:
        self._store = store
        self._settings = settings
        self._clock = clock
        self._wall = wall
        self._on_poll = on_poll
        self.stopped = False

    async def loop(self, rep: ReplicaState) -> None:
        # The flag also ends the loop if a cancellation is swallowed (asyncio.wait_for in 3.11).
        while not self.stopped and self._store.replicas.get(rep.url) is rep:
            try:
                await self.poll_once(rep)
            except asyncio.CancelledError:
                raise
            except Exception:  # never let one bad poll kill the loop
                log.exception("replica poll crashed", extra={"replica": rep.url})
            await asyncio.sleep(self._settings.poll_interval_s)

    async def _fetch(self, rep: ReplicaState) -> tuple[bool, ModelsInfo, MetricsSample]:
        t = self._settings.poll_timeout_s
        drv = rep.driver
        healthy, models, text = await asyncio.gather(
            drv.health(rep.url, t), drv.list_adapters(rep.url, t), drv.metrics_text(rep.url, t)
        )
        return healthy, models, drv.parse_metrics(text)

    async def poll_once(self, rep: ReplicaState) -> None:
        """One poll: health, models and metrics under one timeout; then reconcile residency."""
        models: ModelsInfo | None = None
        ok = False
        error = ""
        started = self._clock()
        started_wall = self._wall()
        try:
            healthy, models, sample = await asyncio.wait_for(self._fetch(rep), self._settings.poll_timeout_s)
            ok = healthy
            if not healthy:
                error = "health check failed"
        except (DriverError, TimeoutError) as exc:
            error = str(exc) or type(exc).__name__
        if ok and models is not None:
            if rep.metrics != sample:  # an unchanged sample keeps the cached placement view
                rep.metrics = sample
            rep.base_names = models.base_names
            rep.failures = 0
            rep.last_seen = self._clock()
            rep.last_seen_wall = self._wall()
            rep.poll_started_wall = started_wall
            if not rep.healthy and self._clock() >= rep.ejected_until:
                rep.healthy = True
                log.info("replica healthy", extra={"replica": rep.url, "pool": rep.pool.name})
                self._store.health_changed(rep.pool.name)
            if rep.driver.capabilities.lists_adapters:  # else our records are the (advisory) ledger
                self.reconcile(rep, models, started)
        else:
            self._store.outliers.mark_failure(rep, error)
        rep.polled.set()
        if self._on_poll is not None:
            self._on_poll(rep, models if ok else None)

    def reconcile(self, rep: ReplicaState, models: ModelsInfo, asked_at: float | None = None) -> None:
        """Align residency with what the replica said (at ``asked_at``) it has registered.

        Facts that changed after the question was asked (a load finished meanwhile) are kept.
        """
        now = self._clock()
        asked = now if asked_at is None else asked_at
        listed = models.adapters
        for name in list(rep.residents):
            r = rep.residents[name]
            if r.state == "resident" and name not in listed and r.since <= asked:
                log.info("adapter vanished from replica", extra={"replica": rep.url, "lora_name": name})
                del rep.residents[name]
            elif r.state == "failed" and now - r.since > 30.0:
                del rep.residents[name]
        for name in listed:
            r2 = rep.residents.get(name)
            if r2 is not None and r2.state != "failed":
                continue
            if r2 is None and self._store.gone_after(rep.url, name, asked):
                continue  # unloaded after the question was asked: a stale answer
            parsed = parse_lora_name(name)
            if parsed is None:
                continue
            rep.residents[name] = Residency(
                lora_name=name,
                adapter_id=parsed[0],
                version=parsed[1],
                state="resident",
                since=now,
                last_used=now,
            )
