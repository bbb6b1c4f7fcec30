"""Which adapter versions are hot, and how many copies of each the cluster keeps warm.

Hot = the active version of every enabled adapter *marked* hot in the registry
(``AdapterInfo.hot``), and, when ``hot_prewarm_rps`` > 0, every serveable version *measured*
hot (this process's request rate ≥ ``hot_prewarm_rps`` over ``rate_window_s``). Each keeps
min(``hot_prewarm_replicas``, healthy replicas of its base model) copies.

``targets`` (lora_name → copies) goes into every placement request (``hot_targets``), so the
evictor never drops a hot version below its count while another victim exists; the
reconciler's hot prewarm (run by one process in the cluster) loads the missing copies.
"""

from __future__ import annotations

from collections.abc import Callable

from registry.snapshot import RoutingSnapshot, VersionInfo
from router.settings import RouterSettings
from router.store import ReplicaStore


class HotSet:
    def __init__(self, settings: RouterSettings, store: ReplicaStore, *, clock: Callable[[], float]) -> None:
        self._settings = settings
        self._store = store
        self._clock = clock
        self._window_start = clock()
        self.counts: dict[str, int] = {}  # requests per lora_name in the current window
        self.rates: dict[str, float] = {}  # lora_name → requests/s over the last window
        self.targets: dict[str, int] = {}  # lora_name → copies kept warm (last refresh)

    def note_request(self, lora_name: str) -> None:
        self.counts[lora_name] = self.counts.get(lora_name, 0) + 1

    def measure(self) -> None:
        """Close the rate window once it is ``rate_window_s`` old."""
        now = self._clock()
        elapsed = now - self._window_start
        if elapsed < self._settings.rate_window_s:
            return
        counts, self.counts = self.counts, {}
        self.rates = {name: n / elapsed for name, n in counts.items()}
        self._window_start = now

    def versions(self, snap: RoutingSnapshot | None) -> dict[str, VersionInfo]:
        """lora_name → version to keep warm now."""
        out: dict[str, VersionInfo] = {}
        if snap is None:
            return out
        for adapter in snap.adapters.values():
            if not adapter.hot or adapter.status != "active" or adapter.active_version is None:
                continue
            active = adapter.versions.get(adapter.active_version)
            if active is not None and active.status == "active":
                out[active.lora_name] = active
        threshold = self._settings.hot_prewarm_rps
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

    def refresh(self, snap: RoutingSnapshot | None) -> dict[str, VersionInfo]:
        """Recompute ``targets``; returns the hot versions (those with a target > 0)."""
        self.measure()
        wanted = self.versions(snap)
        targets: dict[str, int] = {}
        out: dict[str, VersionInfo] = {}
        for name, info in wanted.items():
            healthy = self._store.healthy_count(info.base_model)
            want = min(self._settings.hot_prewarm_replicas, healthy)
            if want > 0:
                targets[name] = want
                out[name] = info
        self.targets = targets
        return out

    def marked(self, snap: RoutingSnapshot | None, info: VersionInfo) -> bool:
        adapter = snap.adapters.get(info.adapter_id) if snap is not None else None
        return adapter is not None and adapter.hot
