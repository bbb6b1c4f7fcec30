"""Evictors: which idle adapters to unload from the chosen replica when it is at ``max_adapters``.

The evictor's answer is final (``Decision.evict``): the runtime unloads exactly those adapters,
so every rule about what may be unloaded lives here, as data read from the snapshot and the
request (``tests/router/test_placement_evictors.py``):

1. Only ``resident`` adapters with no request in flight (``Residency.inflight``: cluster-wide,
   every gateway process) are candidates — never one loading, unloading or serving.
2. Kept copies: a candidate whose eviction would leave fewer healthy, non-``failed`` copies of
   its adapter than ``PlacementRequest.hot_targets[name]`` (a hot adapter), or that the placement
   plan puts on this replica (``PlacementRequest.plan[name]``), is passed over while another
   candidate remains. When only such copies are left, a ``strict_hot`` request (a prewarm, a
   load of the plan) gets None — no room, so kept copies never evict each other — and any other
   request takes them (serving a live request wins; the plan or prewarm restores the copy).
3. Among the rest, each evictor has its own order:

| evictor              | unloads first                                                                      |
|----------------------|------------------------------------------------------------------------------------|
| lru-idle             | the least recently used                                                            |
| lru-idle-keep-hot    | the least recently used, passing over idle copies of adapters still in demand      |
| cost-aware-keep-hot  | the lowest expected reload cost (frequency × recency × load time), same hysteresis |
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Sequence
from typing import ClassVar

from router.placement.framework import EvictionInput, Evictor
from router.placement.types import Residency

_LN2 = math.log(2.0)


def kept(inp: EvictionInput, name: str) -> bool:
    """Whether the copy of ``name`` on ``inp.view`` is one to keep: planned there, or one whose
    eviction would leave fewer copies than its hot target."""
    planned = inp.request.plan.get(name)
    if planned is not None and inp.view.url in planned:
        return True
    want = inp.request.hot_targets.get(name, 0)
    return want > 0 and inp.healthy_copies(name) <= want


def final_victims(inp: EvictionInput, order: Iterable[str], need: int) -> tuple[str, ...] | None:
    """The first ``need`` names of ``order`` (idle residents, preferred victims first) that are
    not copies to keep; kept copies fill the rest unless ``inp.request.strict_hot`` (None).
    ``order`` must hold at least ``need`` names."""
    req = inp.request
    chosen: list[str] = []
    if not req.hot_targets and not req.plan:
        for name in order:
            chosen.append(name)
            if len(chosen) == need:
                break
        return tuple(chosen)
    spared: list[str] = []
    for name in order:
        if len(chosen) == need:
            break
        if kept(inp, name):
            spared.append(name)
        else:
            chosen.append(name)
    if len(chosen) < need:
        if req.strict_hot:
            return None
        chosen.extend(spared[: need - len(chosen)])
    return tuple(chosen)


class LruIdleEvictor(Evictor):
    """The least recently used idle residents, keeping hot and planned copies (rules 1–2)."""

    name: ClassVar[str] = "lru-idle"

    def victims(self, inp: EvictionInput, need: int) -> tuple[str, ...] | None:
        idle = inp.idle_lru()
        if len(idle) < need:
            return None
        return final_victims(inp, (r.lora_name for r in idle), need)


class HotCopyEvictor(Evictor):
    """Idle eviction that keeps copies of adapters still in demand (replication hysteresis).

    An idle resident whose adapter has, summed over all replicas, in-flight ≥ ``low_water`` ×
    max_num_seqs (a copy of a hot adapter that is momentarily idle here) is passed over while
    enough colder idle adapters exist; at most ``scan`` candidates (in :meth:`ranked` order) are
    examined for that. Candidates are ranked least recently used first; subclasses change
    :meth:`ranked`. Hot and planned copies are kept as in :func:`final_victims`.
    """

    name: ClassVar[str] = "lru-idle-keep-hot"

    def __init__(self, low_water: float = 0.05, scan: int = 8) -> None:
        self.low_water = low_water
        self.scan = scan

    def ranked(self, inp: EvictionInput) -> Sequence[Residency]:
        """The replica's idle residents, preferred victims first."""
        return inp.idle_lru()

    def victims(self, inp: EvictionInput, need: int) -> tuple[str, ...] | None:
        if len(inp.idle_lru()) < need:
            return None
        cap = inp.view.max_num_seqs if inp.view.max_num_seqs > 0 else 1
        return final_victims(inp, self._order(inp, self.ranked(inp), cap), need)

    def _order(self, inp: EvictionInput, ranked: Sequence[Residency], cap: int) -> Iterator[str]:
        """The cold candidates among the first ``scan`` (demand computed lazily, one adapter at
        a time), then every other candidate in ranked order."""
        taken: set[str] = set()
        for r in ranked[: self.scan]:
            name = r.lora_name
            if not inp.adapter_inflight(name) / cap >= self.low_water:
                taken.add(name)
                yield name
        for r in ranked:
            if r.lora_name not in taken:
                yield r.lora_name


class CostAwareEvictor(HotCopyEvictor):
    """Evicts the idle residents whose loss costs least, weighing frequency, recency and size
    (GreedyDual-Size-Frequency in spirit, stateless: everything comes from the snapshot).

    value = max(1, requests) × 2^(−idle / half_life_s) × (load_fixed_s + size_bytes / load_bytes_per_s)

    ``requests`` (``Residency.requests``) is how often the adapter was asked for, ``idle`` =
    now − ``last_used`` (≥ 0) decays that count — an adapter popular long ago loses its place —
    and the last factor is the time a reload would take, so with equal demand a large adapter is
    kept over a small one (a registration slot holds one adapter whatever its size: the size
    counts as reload cost, not as space). Lowest value first; ties in LRU order. Copies of
    adapters in demand elsewhere, hot and planned copies are kept as by :class:`HotCopyEvictor`.
    """

    name: ClassVar[str] = "cost-aware-keep-hot"

    def __init__(
        self,
        low_water: float = 0.05,
        scan: int = 8,
        half_life_s: float = 120.0,
        load_fixed_s: float = 0.15,
        load_bytes_per_s: float = 2e9,
    ) -> None:
        if not (0 < half_life_s < math.inf and 0 <= load_fixed_s < math.inf and load_bytes_per_s > 0):
            raise ValueError("half_life_s > 0, load_fixed_s >= 0 and load_bytes_per_s > 0 are required")
        super().__init__(low_water, scan)
        self.half_life_s = half_life_s
        self.load_fixed_s = load_fixed_s
        self.load_bytes_per_s = load_bytes_per_s

    def value(self, r: Residency, now: float) -> float:
        """Expected cost of evicting ``r`` at ``now`` (seconds of reload, weighted by demand)."""
        idle = now - r.last_used
        if not idle > 0.0:  # used "in the future" (clock skew between processes), or NaN
            idle = 0.0 if idle == idle else math.inf
        decay = math.exp(-idle * _LN2 / self.half_life_s)
        count = r.requests if r.requests > 1 else 1
        cost = self.load_fixed_s + (r.size_bytes if r.size_bytes > 0 else 0) / self.load_bytes_per_s
        return count * decay * cost

    def ranked(self, inp: EvictionInput) -> Sequence[Residency]:
        now = inp.now
        value = self.value
        # LRU order in: a stable sort keeps it among equal values
        return sorted(inp.idle_lru(), key=lambda r: value(r, now))

    def cheapest(self, inp: EvictionInput) -> float:
        """The value of the cheapest idle adapter of ``inp.view`` that is not a kept copy (a
        kept one when nothing else is idle); +inf when nothing is idle. What making room there
        destroys, in the default policy's cost model (``router.placement.costs``)."""
        best = math.inf
        spare = math.inf
        now = inp.now
        for r in inp.idle_lru():
            v = self.value(r, now)
            if kept(inp, r.lora_name):
                spare = min(spare, v)
            else:
                best = min(best, v)
        return best if best < math.inf else spare


EVICTORS: dict[str, type[Evictor]] = {
    LruIdleEvictor.name: LruIdleEvictor,
    HotCopyEvictor.name: HotCopyEvictor,
    CostAwareEvictor.name: CostAwareEvictor,
}
