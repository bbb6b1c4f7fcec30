"""Evictors: which idle adapters to unload from the chosen replica when it is at ``max_adapters``.

The evictor's answer is final (``Decision.evict``): the runtime unloads exactly those adapters,
so every rule about what may be unloaded lives here, as data read from the snapshot and the
request (``tests/router/test_placement_evictors.py``):

1. Only ``resident`` adapters with no request in flight (``Resident.inflight``: cluster-wide,
   every gateway process) are candidates — never one loading, unloading or serving.
2. Hot copies: a candidate whose eviction would leave fewer healthy, non-``failed`` copies of
   its adapter than ``PlacementRequest.hot_targets[name]`` is passed over while another
   candidate remains. When only such copies are left, a ``strict_hot`` request (a hot
   prewarm) gets None — no room, so hot adapters never evict each other — and any other
   request takes them (serving a live request wins; the prewarm restores the copy later).
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

from router.placement.framework import PRESENT, Evictor, PickContext, Scorer, Summary
from router.placement.types import ReplicaView, Resident

_LN2 = math.log(2.0)


def keeps_hot_copy(ctx: PickContext, name: str) -> bool:
    """Whether evicting one copy of ``name`` would leave fewer copies than its hot target
    (copies: healthy replicas of the whole snapshot holding it in a state other than ``failed``)."""
    want = ctx.request.hot_targets.get(name, 0)
    if want <= 0:
        return False
    return ctx.healthy_copies(name) <= want


def final_victims(ctx: PickContext, order: Iterable[str], need: int) -> tuple[str, ...] | None:
    """The first ``need`` names of ``order`` (idle residents, preferred victims first) that are
    not hot copies to keep; hot copies fill the rest unless ``ctx.request.strict_hot`` (None).
    ``order`` must hold at least ``need`` names."""
    hot = ctx.request.hot_targets
    chosen: list[str] = []
    if not hot:
        for name in order:
            chosen.append(name)
            if len(chosen) == need:
                break
        return tuple(chosen)
    kept: list[str] = []
    for name in order:
        if len(chosen) == need:
            break
        if name in hot and keeps_hot_copy(ctx, name):
            kept.append(name)
        else:
            chosen.append(name)
    if len(chosen) < need:
        if ctx.request.strict_hot:
            return None
        chosen.extend(kept[: need - len(chosen)])
    return tuple(chosen)


class LruIdleEvictor(Evictor):
    """The least recently used idle residents, keeping hot copies (rules 1–2 of the module doc)."""

    name: ClassVar[str] = "lru-idle"

    def victims(self, ctx: PickContext, index: int, need: int) -> tuple[str, ...] | None:
        idle = ctx.sums[index].idle_lru
        if len(idle) < need:
            return None
        return final_victims(ctx, (r.lora_name for r in idle), need)


class HotCopyEvictor(Evictor):
    """Idle eviction that keeps copies of adapters still in demand (replication hysteresis).

    An idle resident whose adapter has, summed over all replicas, in-flight ≥ ``low_water`` ×
    max_num_seqs (a copy of a hot adapter that is momentarily idle here) is passed over while
    enough colder idle adapters exist; at most ``scan`` candidates (in :meth:`ranked` order) are
    examined for that. Candidates are ranked least recently used first; subclasses change
    :meth:`ranked`. Hot copies (``hot_targets``) are kept as in :func:`final_victims`.
    """

    name: ClassVar[str] = "lru-idle-keep-hot"

    def __init__(self, low_water: float = 0.05, scan: int = 8) -> None:
        self.low_water = low_water
        self.scan = scan

    def ranked(self, ctx: PickContext, index: int) -> Sequence[Resident]:
        """The replica's idle residents, preferred victims first."""
        return ctx.sums[index].idle_lru

    def victims(self, ctx: PickContext, index: int, need: int) -> tuple[str, ...] | None:
        idle = ctx.sums[index].idle_lru
        if len(idle) < need:
            return None
        ranked = self.ranked(ctx, index)
        view = ctx.replicas[index]
        cap = view.max_num_seqs if view.max_num_seqs > 0 else 1
        return final_victims(ctx, self._order(ctx, ranked, cap), need)

    def _order(self, ctx: PickContext, ranked: Sequence[Resident], cap: int) -> Iterator[str]:
        """The cold candidates among the first ``scan`` (demand computed lazily, one adapter at
        a time), then every other candidate in ranked order."""
        taken: set[str] = set()
        for r in ranked[: self.scan]:
            name = r.lora_name
            # Σ in-flight of this adapter over every replica of the snapshot holding it.
            demand = ctx.adapter_inflight(name)
            if not demand / cap >= self.low_water:
                taken.add(name)
                yield name
        for r in ranked:
            if r.lora_name not in taken:
                yield r.lora_name


class CostAwareEvictor(HotCopyEvictor):
    """Evicts the idle residents whose loss costs least, weighing frequency, recency and size
    (GreedyDual-Size-Frequency in spirit, stateless: everything comes from the snapshot).

    value = max(1, requests) × 2^(−idle / half_life_s) × (load_fixed_s + size_bytes / load_bytes_per_s)

    ``requests`` (``Resident.requests``) is how often the adapter was asked for, ``idle`` =
    now − ``last_used`` (≥ 0) decays that count — an adapter popular long ago loses its place —
    and the last factor is the time a reload would take, so with equal demand a large adapter is
    kept over a small one (a registration slot holds one adapter whatever its size: the size
    counts as reload cost, not as space). Lowest value first; ties in LRU order. Copies of
    adapters in demand elsewhere and hot copies are kept as by :class:`HotCopyEvictor`.
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

    def value(self, r: Resident, now: float) -> float:
        """Expected cost of evicting ``r`` at ``now`` (seconds of reload, weighted by demand)."""
        idle = now - r.last_used
        if not idle > 0.0:  # used "in the future" (clock skew between processes), or NaN
            idle = 0.0 if idle == idle else math.inf
        decay = math.exp(-idle * _LN2 / self.half_life_s)
        count = r.requests if r.requests > 1 else 1
        cost = self.load_fixed_s + (r.size_bytes if r.size_bytes > 0 else 0) / self.load_bytes_per_s
        return count * decay * cost

    def ranked(self, ctx: PickContext, index: int) -> Sequence[Resident]:
        idle = ctx.sums[index].idle_lru  # LRU order: a stable sort keeps it among equal values
        now = ctx.now
        value = self.value
        return sorted(idle, key=lambda r: value(r, now))


class EvictionCostScorer(Scorer):
    """Prefers replicas where making room is cheap, as :class:`CostAwareEvictor` prices it.

    | replica                                                        | score                          |
    |----------------------------------------------------------------|--------------------------------|
    | A present (staging/loading/resident) or base-model request     | 1.0                            |
    | fewer than max_adapters registered (free slot)                 | 1.0                            |
    | at max_adapters, cheapest idle adapter of eviction value ``v`` | 0.1 + (t − 0.1) / (1 + v/(c·s)) |
    | at max_adapters, nothing idle to evict                         | 0.0                            |

    ``v`` is the evictor's :meth:`CostAwareEvictor.value` of the replica's cheapest idle
    adapter at the start of the current second, ``floor(now)`` (requests × recency decay ×
    reload time; the score is memoised per view and second, so a pick costs one lookup per
    replica, and a price moves by under 1 % within a second), ``c`` its ``load_fixed_s`` (the
    price of one cold request), ``s`` = ``scale`` and ``t`` = ``top`` (< 1: a free slot is
    preferred to any eviction). The cheapest adapter is found once per
    view (memoised): all values decay at the same rate, so which one is cheapest does not
    change with ``now`` (the highest of ``log(max(1, requests) × reload time) + last_used ×
    ln 2 / half_life_s``, first in LRU order among equals, NaN ``last_used`` first). So a new
    adapter evicts where it destroys least — the replicas together act like one cache, as in
    the offline bound of ``benchmarks/bounds.py`` — instead of where the least recently used
    adapter happens to be (``free-slot``).
    """

    bounded: ClassVar[bool] = True
    name: ClassVar[str] = "eviction-cost"
    reads: ClassVar[frozenset[str]] = frozenset({"residents", "max_adapters"})

    def __init__(self, evictor: CostAwareEvictor | None = None, scale: float = 0.3, top: float = 0.8) -> None:
        if not 0 < scale < math.inf or not 0.1 <= top <= 1.0:
            raise ValueError("scale must be > 0 and finite, top in [0.1, 1]")
        self.evictor = evictor or CostAwareEvictor()
        self.scale = scale
        self.top = top
        ev = self.evictor
        self._key = f"cheapest:{ev.half_life_s!r}:{ev.load_fixed_s!r}:{ev.load_bytes_per_s!r}"
        self._skey = f"eviction-cost:{scale!r}:{top!r}:{self._key}"

    def cheapest(self, view: ReplicaView, s: Summary) -> Resident | None:
        """The idle resident of ``view`` that costs least to evict at any time (memoised)."""
        d = view.derived
        key = self._key
        if key in d:
            return d[key]  # type: ignore[no-any-return]
        best: Resident | None = None
        low = math.inf
        key_of = self.key_of
        for r in s.idle_lru:
            k = key_of(r)
            if best is None or k < low:
                best, low = r, k
        d[key] = best
        return best

    def key_of(self, r: Resident) -> float:
        """``log(max(1, requests) × reload time) + last_used × ln 2 / half_life_s`` (-inf for a
        NaN ``last_used``): the evictor's value at any ``now`` ≥ last_used is ``exp(key − now ×
        ln 2 / half_life_s)``, so the lowest key is the cheapest idle adapter at every time."""
        ev = self.evictor
        count = r.requests if r.requests > 1 else 1
        cost = ev.load_fixed_s + (r.size_bytes if r.size_bytes > 0 else 0) / ev.load_bytes_per_s
        k = math.log(count * cost) if cost > 0 else -math.inf
        lu = r.last_used
        return -math.inf if lu != lu else k + lu * (_LN2 / ev.half_life_s)

    @staticmethod
    def bucket(now: float) -> float | None:
        """The second ``now`` falls in (``floor(now)``: exact, ``bucket <= now < bucket + 1``),
        or None for a non-finite ``now`` (priced as is, not memoised)."""
        return float(math.floor(now)) if math.isfinite(now) else None

    def slot_score(self, view: ReplicaView, s: Summary, now: float) -> float:
        """The score of ``view`` (summary ``s``) for an adapter not present there."""
        if s.free:
            return 1.0
        r = self.cheapest(view, s)
        if r is None:
            return 0.0
        q = self.bucket(now)
        if q is None:
            return self._price(r, now)
        d = view.derived
        memo = d.get(self._skey)
        if memo is not None and memo[0] == q:
            return memo[1]  # type: ignore[no-any-return]
        score = self._price(r, q)
        d[self._skey] = (q, score)
        return score

    def _price(self, r: Resident, at: float) -> float:
        ev = self.evictor
        v = ev.value(r, at)
        c = ev.load_fixed_s if ev.load_fixed_s > 0 else 1.0
        return 0.1 + (self.top - 0.1) / (1.0 + v / (c * self.scale))

    def score(self, ctx: PickContext) -> list[float]:
        n = len(ctx.replicas)
        if ctx.request.lora_name is None:
            return [1.0] * n
        now = ctx.now
        slot = self.slot_score
        out = [slot(v, s, now) for v, s in zip(ctx.replicas, ctx.sums, strict=True)]
        for i, t in ctx.held.items():
            if t.state in PRESENT:
                out[i] = 1.0
        return out


EVICTORS: dict[str, type[Evictor]] = {
    LruIdleEvictor.name: LruIdleEvictor,
    HotCopyEvictor.name: HotCopyEvictor,
    CostAwareEvictor.name: CostAwareEvictor,
}
