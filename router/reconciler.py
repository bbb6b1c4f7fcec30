"""Reconciler: keeps what replicas hold in line with the registry's routing snapshot.

Runs on every ``update_snapshot`` (kicked) and every ``reconcile_interval_s``:
- adapters that are disabled or gone, and versions that are disabled or gone, are unloaded
  at once (``reason`` ``disabled``);
- versions that no longer serve by default (``retired``, ``ready``) are unloaded once idle —
  no request in flight and none routed there for ``retired_idle_unload_s`` (pinned traffic
  keeps them) (``reason`` ``retired``);
- load records stuck in ``staging``/``loading`` with no load in flight are dropped;
- hot adapters (measured request rate ≥ ``hot_prewarm_rps``) are kept on
  ``hot_prewarm_replicas`` replicas (prewarmed).

Nothing is unloaded before the first snapshot arrives.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from router.loader import Loader
from router.store import ReplicaStore

if TYPE_CHECKING:
    from router.core import Router

log = logging.getLogger("loraplane.router.reconciler")


class Reconciler:
    def __init__(
        self, router: Router, store: ReplicaStore, loader: Loader, *, clock: Callable[[], float]
    ) -> None:
        self._router = router
        self._store = store
        self._loader = loader
        self._clock = clock
        self._kick = asyncio.Event()
        self._window_start = clock()
        self.rates: dict[str, float] = {}
        self.stopped = False  # lora_name → requests/s over the last window

    def kick(self) -> None:
        self._kick.set()

    async def run(self) -> None:
        interval = self._router.settings.reconcile_interval_s
        while not self.stopped:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._kick.wait(), interval)
            self._kick.clear()
            try:
                await self.reconcile_once()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("reconcile pass failed")

    def _measure(self) -> None:
        now = self._clock()
        window = self._router.settings.rate_window_s
        elapsed = now - self._window_start
        if elapsed < window:
            return
        counts = self._loader.counts
        self._loader.counts = {}
        self.rates = {name: n / elapsed for name, n in counts.items()}
        self._window_start = now

    async def reconcile_once(self) -> None:
        settings = self._router.settings
        snap = self._router.snapshot
        now = self._clock()
        self._measure()
        if snap is None:
            return
        for rep in list(self._store.replicas.values()):
            if not rep.healthy:
                continue
            for name, r in list(rep.residents.items()):
                if r.state in ("staging", "loading"):
                    if (
                        not self._loader.in_flight(rep.url, name)
                        and now - r.since > settings.load_timeout_s + 5
                    ):
                        rep.residents.pop(name, None)
                    continue
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
                    and r.inflight == 0
                    and now - r.last_used >= settings.retired_idle_unload_s
                ):
                    reason = "retired"
                if reason is not None:
                    await self._loader.unload(rep, name, reason)
        await self._prewarm_hot()

    async def _prewarm_hot(self) -> None:
        settings = self._router.settings
        if settings.hot_prewarm_rps <= 0 or self._router.snapshot is None:
            return
        for name, rate in self.rates.items():
            if rate < settings.hot_prewarm_rps:
                continue
            adapter_id, _, rest = name.partition("@")
            version_name = rest.split("-", 1)[0]
            info = self._router.find_version(adapter_id, version_name)
            if info is None or info.lora_name != name:
                continue
            holders = [
                r
                for r in self._store.for_base(info.base_model)
                if r.healthy and name in r.residents and r.residents[name].state != "failed"
            ]
            want = min(settings.hot_prewarm_replicas, self._store.healthy_count(info.base_model))
            if len(holders) < want:
                log.info("prewarming hot adapter", extra={"lora_name": name, "rate": round(rate, 2)})
                await self._router.prewarm(info, want)
