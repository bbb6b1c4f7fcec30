"""Placement scorers: each returns one score in [0, 1] per candidate replica.

Every scorer declares the ``ReplicaView`` fields it reads (``reads``); the score tables are
in each class docstring and in ``router/placement/README.md``. ``A`` is the requested adapter.
"""

from __future__ import annotations

from typing import ClassVar

from router.placement.framework import PRESENT, PickContext, Scorer, Summary, summary
from router.placement.types import ReplicaView, Resident


def _frac(x: int, cap: int) -> float:
    return x / cap if cap > 0 else float(x > 0)


def saturated_for(
    view: ReplicaView,
    target: Resident | None,
    high_water: float,
    adapter_high: float,
    s: Summary | None = None,
) -> bool:
    """True when sending one more request for ``target``'s adapter to ``view`` would queue it.

    Saturated: replica load ≥ ``high_water``, or the adapter's own in-flight there ≥
    ``adapter_high`` × max_num_seqs, or the adapter is not running there while the replica's
    running set is full (vLLM would defer it behind ``max_loras`` other adapters).
    """
    if s is None:
        s = summary(view)
    if s.load >= high_water:
        return True
    inflight = target.inflight if target is not None else 0
    if inflight > 0:
        return _frac(inflight, view.max_num_seqs) >= adapter_high
    return s.running >= view.max_loras


class ResidencyAffinityScorer(Scorer):
    """Affinity to replicas that hold the adapter, with demand-driven replication + hysteresis.

    | replica                                                              | score |
    |----------------------------------------------------------------------|-------|
    | A resident, not saturated (spreading, or the primary copy)           | 1.0   |
    | A staging/loading there (join the load in flight), not saturated     | 0.9   |
    | A resident, not saturated, consolidating (demand < low water), extra | 0.6   |
    | A held but saturated, another holder is not                          | 0.3   |
    | A held, every holder saturated, some other replica is not → replicate| 0.0   |
    | A held, every replica saturated (replicating would not help)         | 1.0   |
    | A not held / base-model request                                      | 0.0   |

    *Saturated* is :func:`saturated_for`. *Demand* is A's in-flight summed over its holders as
    a fraction of max_num_seqs; with two or more copies, requests spread over them while demand
    ≥ ``low_water``, and below it they consolidate on the primary copy (most in-flight for A,
    then most recently used) so the extra copies go idle and become evictable. A copy is only
    added above ``high_water`` and only drained below ``low_water``: no flapping in between.
    """

    bounded: ClassVar[bool] = True
    name: ClassVar[str] = "resident-affinity"
    reads: ClassVar[frozenset[str]] = frozenset(
        {"residents", "inflight", "waiting", "max_num_seqs", "max_loras"}
    )

    def __init__(self, high_water: float = 0.75, adapter_high: float = 0.25, low_water: float = 0.05) -> None:
        if not 0.0 <= low_water <= high_water:
            raise ValueError("need 0 <= low_water <= high_water")
        self.high_water = high_water
        self.adapter_high = adapter_high
        self.low_water = low_water

    def score(self, ctx: PickContext) -> list[float]:
        n = len(ctx.replicas)
        out = [0.0] * n
        targets = ctx.held
        if not targets:
            return out
        present = PRESENT
        sums = ctx.sums
        hw, ah = self.high_water, self.adapter_high
        # One pass over the copies (a hot adapter can have many): saturation (saturated_for(),
        # inlined) and total demand.
        free: list[int] = []
        saturated: list[int] = []
        demand = 0
        for i, t in targets.items():
            if t.state not in present:
                continue
            s = sums[i]
            f = t.inflight
            demand += f
            if s.load >= hw or ((f / s.cap >= ah) if f else s.full):
                saturated.append(i)
            else:
                free.append(i)
        if not free:
            if not saturated:
                return out
            held = targets.keys()
            if any(not (s.load >= hw or s.full) for i, s in enumerate(sums) if i not in held):
                return out  # every copy saturated, another replica is not: replicate
            for i in saturated:
                out[i] = 1.0
            return out
        for i in saturated:
            out[i] = 0.3
        if len(free) + len(saturated) > 1 and demand / sums[free[0]].cap < self.low_water:
            # Consolidate on the primary copy: most in-flight, then most recently used.
            primary = max((targets[i].inflight, targets[i].last_used, -i) for i in free + saturated)
            p = -primary[2]
            for i in free:
                out[i] = 0.6
            if p in free:
                out[p] = 1.0 if targets[p].state == "resident" else 0.9
            return out
        for i in free:
            out[i] = 1.0 if targets[i].state == "resident" else 0.9
        return out


class RunningSetScorer(Scorer):
    """Keeps the distinct adapters running on a replica within its ``max_loras``.

    | replica                                                          | score                    |
    |------------------------------------------------------------------|--------------------------|
    | base-model request (never limited by max_loras)                  | 1.0                      |
    | A already has requests in flight there (shares its slot)         | 1.0                      |
    | running set has room (k distinct adapters in flight < max_loras) | 0.7 + 0.2 × (1 − k/max)  |
    | running set full (k ≥ max_loras: A would be deferred behind the  | 0.4 / (1 + k − max)      |
    | others; fewer adapters ahead of it is better)                    |                          |
    """

    bounded: ClassVar[bool] = True
    name: ClassVar[str] = "running-set"
    reads: ClassVar[frozenset[str]] = frozenset({"residents", "max_loras"})

    def score(self, ctx: PickContext) -> list[float]:
        n = len(ctx.replicas)
        if ctx.request.lora_name is None:
            return [1.0] * n
        out = [s.room for s in ctx.sums]  # precomputed per snapshot
        for i, t in ctx.held.items():
            if t.inflight > 0:
                out[i] = 1.0
        return out


class FreeSlotScorer(Scorer):
    """Prefers replicas that can register A without evicting, then cheap evictions.

    | replica                                                            | score                      |
    |--------------------------------------------------------------------|----------------------------|
    | A present (staging/loading/resident) or base-model request         | 1.0                        |
    | fewer than max_adapters registered (free slot)                     | 1.0                        |
    | at max_adapters, LRU idle adapter unused for ``t`` seconds         | 0.1 + 0.5 × min(1, t/H)    |
    | at max_adapters, nothing idle to evict                             | 0.0                        |

    ``H`` is ``idle_horizon_s`` (default 60 s): evicting an adapter used a moment ago is costly
    (it is likely to come back), one idle for ``H`` or more is cheap.
    """

    bounded: ClassVar[bool] = True
    name: ClassVar[str] = "free-slot"
    reads: ClassVar[frozenset[str]] = frozenset({"residents", "max_adapters"})

    def __init__(self, idle_horizon_s: float = 60.0) -> None:
        if idle_horizon_s <= 0:
            raise ValueError("idle_horizon_s must be > 0")
        self.idle_horizon_s = idle_horizon_s

    def score(self, ctx: PickContext) -> list[float]:
        n = len(ctx.replicas)
        if ctx.request.lora_name is None:
            return [1.0] * n
        now, h = ctx.now, self.idle_horizon_s
        # 1.0 if free; 0.0 if nothing idle; else 0.1 + 0.5 × clamp((now − LRU last_used) / H).
        out = [
            1.0
            if s.free
            else (
                0.0
                if (x := s.lru_last_used) is None
                else (0.6 if (f := (now - x) / h) >= 1.0 else (0.1 + 0.5 * f if f > 0.0 else 0.1))
            )
            for s in ctx.sums
        ]
        present = PRESENT
        for i, t in ctx.held.items():
            if t.state in present:
                out[i] = 1.0
        return out


class LoadScorer(Scorer):
    """Prefers lightly loaded replicas.

    | replica | score                                              |
    |---------|----------------------------------------------------|
    | any     | 1 − min(1, (inflight + waiting) / max_num_seqs)    |

    ``inflight`` is the router's own count, ``waiting`` the scraped ``vllm:num_requests_waiting``
    (requests of other routers and LoRA-deferred ones).
    """

    bounded: ClassVar[bool] = True
    name: ClassVar[str] = "load"
    reads: ClassVar[frozenset[str]] = frozenset({"inflight", "waiting", "max_num_seqs"})

    def score(self, ctx: PickContext) -> list[float]:
        return [1.0 - s.load for s in ctx.sums]


class LeastRequestScorer(Scorer):
    """Fewest requests in flight (router's own count), min–max normalised over the candidates.

    | replica                                  | score                               |
    |------------------------------------------|-------------------------------------|
    | all candidates equal                     | 1.0                                 |
    | otherwise                                | (max − inflight) / (max − min)      |
    """

    bounded: ClassVar[bool] = True
    name: ClassVar[str] = "least-request"
    reads: ClassVar[frozenset[str]] = frozenset({"inflight"})

    def score(self, ctx: PickContext) -> list[float]:
        return _minmax_low_is_best([v.inflight for v in ctx.replicas])


class QueueScorer(Scorer):
    """GIE's queue-scorer: shorter scraped waiting queue is better, min–max normalised.

    | replica                                  | score                               |
    |------------------------------------------|-------------------------------------|
    | all candidates equal                     | 1.0                                 |
    | otherwise                                | (max − waiting) / (max − min)       |
    """

    bounded: ClassVar[bool] = True
    name: ClassVar[str] = "queue"
    reads: ClassVar[frozenset[str]] = frozenset({"waiting"})

    def score(self, ctx: PickContext) -> list[float]:
        return _minmax_low_is_best([v.waiting for v in ctx.replicas])


class KvCacheScorer(Scorer):
    """GIE's kv-cache-utilization-scorer.

    | replica | score                 |
    |---------|-----------------------|
    | any     | 1 − kv_cache_usage    |
    """

    name: ClassVar[str] = "kv-cache"
    reads: ClassVar[frozenset[str]] = frozenset({"kv_cache_usage"})

    def score(self, ctx: PickContext) -> list[float]:
        return [1.0 - v.kv_cache_usage for v in ctx.replicas]


class GieLoraAffinityScorer(Scorer):
    """The Gateway API Inference Extension's lora-affinity-scorer, from ``vllm:lora_requests_info`` only.

    | replica (first matching row)                                         | score |
    |----------------------------------------------------------------------|-------|
    | A listed in ``running_lora_adapters``                                 | 1.0   |
    | replica lists fewer adapters than its ``max_lora``                   | 0.8   |
    | A listed in ``waiting_lora_adapters`` only                           | 0.6   |
    | otherwise                                                            | 0.0   |
    | base-model request                                                   | 1.0   |

    ``count="union"`` (default) counts the distinct names listed; ``count="sum"`` adds the
    lengths of both lists as GIE's Go code does (with vLLM ≥ 0.11.1 both labels list the same
    set, so "sum" counts each adapter twice).
    """

    bounded: ClassVar[bool] = True
    name: ClassVar[str] = "gie-lora-affinity"
    reads: ClassVar[frozenset[str]] = frozenset({"lora_running", "lora_waiting", "max_loras"})

    def __init__(self, count: str = "union") -> None:
        if count not in ("union", "sum"):
            raise ValueError('count must be "union" or "sum"')
        self.count = count

    def score(self, ctx: PickContext) -> list[float]:
        name = ctx.request.lora_name
        if name is None:
            return [1.0] * len(ctx.replicas)
        out: list[float] = []
        union = self.count == "union"
        for v in ctx.replicas:
            if name in v.lora_running:
                out.append(1.0)
                continue
            if union:
                run, wait = v.lora_running, v.lora_waiting
                listed = len(run) if wait == run or not wait else len(set(run).union(wait))
            else:
                listed = len(v.lora_running) + len(v.lora_waiting)
            if listed < v.max_loras:
                out.append(0.8)
            elif name in v.lora_waiting:
                out.append(0.6)
            else:
                out.append(0.0)
        return out


def _minmax_low_is_best(values: list[int]) -> list[float]:
    lo = min(values, default=0)
    hi = max(values, default=0)
    if hi == lo:
        return [1.0] * len(values)
    span = hi - lo
    return [(hi - x) / span for x in values]


SCORERS: dict[str, type[Scorer]] = {
    cls.name: cls
    for cls in (
        ResidencyAffinityScorer,
        RunningSetScorer,
        FreeSlotScorer,
        LoadScorer,
        LeastRequestScorer,
        QueueScorer,
        KvCacheScorer,
        GieLoraAffinityScorer,
    )
}
