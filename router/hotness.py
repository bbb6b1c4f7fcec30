"""Which adapter versions are hot, and how many copies of each the cluster keeps warm.

Hot = the active version of every enabled adapter *marked* hot in the registry
(``AdapterInfo.hot``), and, when ``hot_prewarm_rps`` > 0, every serveable version *measured*
hot: its request rate over the last ``rate_window_s``, **counted cluster-wide** (every gateway
process adds its counts to the cluster's demand board, ``router.cluster.board``), is at least
``hot_prewarm_rps`` — so with G gateways the threshold stays ``hot_prewarm_rps``, not G times it
(issue 24.11). Each keeps min(``hot_prewarm_replicas``, healthy replicas of its base model) copies.

``targets`` (lora_name → copies) goes into every placement request (``hot_targets``), so the
evictor never drops a hot version below its count while another victim exists; the placement
plan (or, with the controller off, the reconciler's hot prewarm; one process in the cluster)
loads the missing copies.
"""

from __future__ import annotations

from collections.abc import Callable

from registry.snapshot import RoutingSnapshot, VersionInfo
from router.cluster import Board
from router.settings import RouterSettings
from router.store import ReplicaStore


class HotSet:
    def __init__(self, settings: RouterSettings, store: ReplicaStore, *, clock: Callable[[], float]) -> None:
        self._settings = settings
        self._store = store
        self._clock = clock
        self.pending: dict[str, int] = {}  # requests per lora_name not yet added to the board
        self.rates: dict[str, float] = {}  # lora_name → requests/s over the window, cluster-wide
        self.targets: dict[str, int] = {}  # lora_name → copies kept warm (last refresh)

    def note_request(self, lora_name: str) -> None:
        self.pending[lora_name] = self.pending.get(lora_name, 0) + 1

    def take_pending(self) -> dict[str, int]:
        """This process's counts since the last call (for the demand board)."""
        out, self.pending = self.pending, {}
        return out

    async def measure(self, board: Board, wall: float) -> None:
        """The cluster-wide rates over the last ``rate_window_s`` (the closed buckets)."""
        window = max(board.bucket_s, self._settings.rate_window_s)
        last = board.bucket(wall)
        first = last - max(1, round(window / board.bucket_s))
        counts = await board.counts(first, last)
        seconds = (last - first) * board.bucket_s
        self.rates = {name: n / seconds for name, n in counts.items() if n > 0}

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
        """Recompute ``targets`` (from the last ``measure``); returns the hot versions (those
        with a target > 0)."""
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
