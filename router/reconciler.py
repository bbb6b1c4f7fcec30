"""Reconciler: keeps what replicas hold in line with the registry's routing snapshot.

Runs on every ``update_snapshot`` (kicked) and every ``reconcile_interval_s``:
- adapters that are disabled or gone, and versions that are disabled or gone, are unloaded
  at once (``reason`` ``disabled``);
- versions that no longer serve by default (``retired``, ``ready``) are unloaded once idle —
  no request in flight and none routed there for ``retired_idle_unload_s`` (pinned traffic
  keeps them) (``reason`` ``retired``);
- load records stuck in ``staging``/``loading`` with no load in flight are dropped;
- hot adapters are kept on min(``hot_prewarm_replicas``, healthy replicas of their base model)
  replicas (prewarmed through the normal placement + load path, so ``max_adapters`` holds and
  nothing with requests in flight is evicted): the active version of every adapter *marked* hot
  in the registry (``AdapterInfo.hot``, enabled adapters only), and, when ``hot_prewarm_rps`` > 0,
  every version *measured* hot (request rate ≥ ``hot_prewarm_rps`` over ``rate_window_s``).
  Unmarking (or cooling down) only stops the prewarm; nothing is unloaded for it. A replica
  where the version's load failed is not retried until its failed record expires (30 s).

Protection of hot copies: ``hot_targets`` (lora_name → copies wanted, from the last pass) lets
the router's eviction (``Router._make_room``) prefer another idle adapter to a copy whose
eviction would drop a hot version below its count (``keeps_hot_copy``); when it must evict one
anyway, the next pass prewarms it again (a prewarm never evicts another such copy).

Nothing is unloaded before the first snapshot arrives.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from registry.snapshot import VersionInfo
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
        self.rates: dict[str, float] = {}  # lora_name → requests/s over the last window
        self.hot_targets: dict[str, int] = {}  # lora_name → copies kept warm (last pass)
        self._short: set[str] = set()  # hot versions below their count (logged once until met)
        self.stopped = False

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

    def hot_versions(self) -> dict[str, VersionInfo]:
        """lora_name → version to keep warm now: the active version of each enabled adapter marked
        hot, and (``hot_prewarm_rps`` > 0) each version of an enabled adapter measured hot."""
        snap = self._router.snapshot
        out: dict[str, VersionInfo] = {}
        if snap is None:
            return out
        for adapter in snap.adapters.values():
            if not adapter.hot or adapter.status != "active" or adapter.active_version is None:
                continue
            active = adapter.versions.get(adapter.active_version)
            if active is not None and active.status == "active":
                out[active.lora_name] = active
        threshold = self._router.settings.hot_prewarm_rps
        if threshold <= 0:
            return out
        for name, rate in self.rates.items():
            if rate < threshold or name in out:
                continue
            adapter_id, _, rest = name.partition("@")
            measured = snap.adapters.get(adapter_id)
            info = measured.versions.get(rest.split("-", 1)[0]) if measured is not None else None
            if measured is None or measured.status == "disabled" or info is None:
                continue
            if info.status == "disabled" or info.lora_name != name:
                continue
            out[name] = info
        return out

    def keeps_hot_copy(self, lora_name: str, base_model: str) -> bool:
        """Whether evicting one copy of ``lora_name`` would drop it below its hot count."""
        want = self.hot_targets.get(lora_name)
        if not want:
            return False
        copies = 0
        for rep in self._store.for_base(base_model):
            r = rep.residents.get(lora_name)
            if rep.healthy and r is not None and r.state != "failed":
                copies += 1
        return copies <= want

    async def _prewarm_hot(self) -> None:
        settings = self._router.settings
        wanted = self.hot_versions()
        plan: list[tuple[VersionInfo, int, set[str]]] = []
        targets: dict[str, int] = {}
        for name, info in wanted.items():
            healthy = [r for r in self._store.for_base(info.base_model) if r.healthy]
            want = min(settings.hot_prewarm_replicas, len(healthy))
            if want <= 0:
                continue
            targets[name] = want
            holders = 0
            failed: set[str] = set()
            for r in healthy:
                res = r.residents.get(name)
                if res is None:
                    continue
                if res.state == "failed":
                    failed.add(r.url)
                else:
                    holders += 1
            if holders < want:
                plan.append((info, want, failed))
        self.hot_targets = targets
        self._short &= {info.lora_name for info, _, _ in plan}
        for info, want, failed in plan:
            level = logging.DEBUG if info.lora_name in self._short else logging.INFO
            self._short.add(info.lora_name)
            log.log(
                level,
                "prewarming hot adapter",
                extra={
                    "lora_name": info.lora_name,
                    "marked": self._marked(info),
                    "rate": round(self.rates.get(info.lora_name, 0.0), 2),
                    "replicas": want,
                },
            )
            await self._router.prewarm(info, want, exclude=failed, keep_hot_copies=True)

    def _marked(self, info: VersionInfo) -> bool:
        snap = self._router.snapshot
        adapter = snap.adapters.get(info.adapter_id) if snap is not None else None
        return adapter is not None and adapter.hot
