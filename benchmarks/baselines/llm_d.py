"""Today's llm-d router default scorer set, as a placement ``Profile`` for the benchmark.

The llm-d router's endpoint picker (moved there from the Gateway API Inference Extension, GIE)
scores every candidate pod with a weighted sum of scorers and takes the highest score
(``max-score-picker``, random tie-break). Its default scheduling profile (llm-d-router /
llm-d-inference-scheduler ``deploy/config``; scorer semantics from GIE ``pkg/epp/scheduling/
framework/plugins``) is reproduced here with loraplane's plugin pipeline:

| scorer (llm-d name)            | score per pod                                          | weight |
|--------------------------------|--------------------------------------------------------|--------|
| `queue-scorer`                 | min–max of waiting requests, fewer is better           | 2      |
| `kv-cache-utilization-scorer`  | 1 − KV-cache usage                                     | 2      |
| `prefix-cache-scorer`          | share of the prompt's blocks the pod has cached, from  | 3      |
|                                | an approximate index of where prompts were sent; block |        |
|                                | hashes seeded with the target model = the adapter name |        |
| `lora-affinity-scorer`         | 1 adapter active there, 0.8 room for one more adapter,  | 1      |
|                                | 0.6 adapter only waiting there, else 0                 |        |

The prefix index is the replay's approximate index (``router.prefix.PrefixIndex``, recorded
where each prompt was routed, keyed by adapter), handed in as ``PlacementRequest.prefix`` — the
same estimate GIE's prefix plugin keeps from its own routing decisions. Eviction when a pod is
at its adapter limit: least recently used idle adapter (vLLM's own LRU; llm-d has no eviction of
its own). Simplified: no pd-disaggregation, no session-affinity or load-aware scorers (not in the
default set), one scheduling profile.
"""

from __future__ import annotations

from router.placement.evictors import LruIdleEvictor
from router.placement.filters import CanHostFilter, ExcludeFilter, HealthyFilter
from router.placement.framework import SchedulerProfile, Scorer
from router.placement.pickers import MaxScoreRandomTiePicker
from router.placement.scorers import GieLoraAffinityScorer, KvCacheScorer, PrefixCacheScorer, QueueScorer

NAME = "llm-d"
WEIGHTS = {"queue": 2.0, "kv-cache": 2.0, "prefix-cache": 3.0, "lora-affinity": 1.0}


def llm_d(*, seed: int | None = 0, weights: dict[str, float] | None = None) -> SchedulerProfile:
    """The llm-d default scorer set (weights as in the table; ``weights`` overrides some)."""
    w = {**WEIGHTS, **(weights or {})}
    unknown = set(w) - set(WEIGHTS)
    if unknown:
        raise ValueError(f"unknown llm-d scorer weights: {sorted(unknown)}")
    scorers: list[tuple[Scorer, float]] = [
        (QueueScorer(), w["queue"]),
        (KvCacheScorer(), w["kv-cache"]),
        (PrefixCacheScorer(), w["prefix-cache"]),
        (GieLoraAffinityScorer(), w["lora-affinity"]),
    ]
    return SchedulerProfile(
        NAME,
        [HealthyFilter(), ExcludeFilter(), CanHostFilter()],
        scorers,
        MaxScoreRandomTiePicker(seed),
        LruIdleEvictor(),
    )
