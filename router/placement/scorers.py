"""Placement scorers: each returns one score in [0, 1] per candidate replica.

Every scorer declares the ``ReplicaView`` fields it reads (``reads``); the score tables are
in each class docstring and in ``router/placement/README.md``. ``A`` is the requested adapter.
"""

from __future__ import annotations

from typing import ClassVar

from router.placement.framework import PRESENT, PickContext, Scorer


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


class PrefixCacheScorer(Scorer):
    """The approximate prefix-cache scorer of GIE / llm-d, keyed by adapter: the share of the
    request's prompt that the router's prefix index says the replica has cached *for this
    adapter* (vLLM keys its prefix cache by ``lora_name``; the index seeds its block hashes
    with it).

    | replica | score                                                       |
    |---------|-------------------------------------------------------------|
    | any     | cached prompt tokens there / prompt tokens (0 when unknown) |
    """

    bounded: ClassVar[bool] = True
    name: ClassVar[str] = "prefix-cache"
    reads: ClassVar[frozenset[str]] = frozenset({"url"})

    def score(self, ctx: PickContext) -> list[float]:
        req = ctx.request
        total = req.prompt_tokens
        prefix = req.prefix
        if total <= 0 or not prefix:
            return [0.0] * len(ctx.replicas)
        return [min(1.0, prefix.get(v.url, 0) / total) for v in ctx.replicas]


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
        RunningSetScorer,
        FreeSlotScorer,
        LoadScorer,
        LeastRequestScorer,
        QueueScorer,
        KvCacheScorer,
        GieLoraAffinityScorer,
        PrefixCacheScorer,
    )
}
