"""Named placement profiles and ``make_profile`` (selection by configuration).

``make_profile(name, **params)`` returns a fresh profile (each instance holds its own RNG /
round-robin counter). Profiles:

- ``default`` — loraplane's policy (``default.py``): the lowest expected cost in seconds over a
  few candidates (tier the adapter comes from, cold load and what it evicts, running-set
  deferral, load, cached prefix, the placement plan); cost-aware eviction. One implementation.
- ``round-robin``, ``least-request``, ``random`` — baselines.
- ``gie-lora-affinity`` — the Gateway API Inference Extension's lora-affinity + queue +
  kv-cache scorers, max-score picker with random tie-break.
- ``llm-d`` — the llm-d router's default scorers: queue, KV-cache utilisation, prefix cache
  (keyed by adapter) and LoRA affinity.
- ``custom`` — any pipeline from the plugin registries: ``filters=[...]``,
  ``scorers=[[name, weight, {params}], ...]``, ``picker=name`` or ``[name, {params}]``,
  ``evictor=name`` or ``[name, {params}]``.

The other profiles run the plugin pipeline (``framework.py``). All baselines use the same filters
(healthy, exclude, can-host) and the same LRU idle eviction (``lru-idle``, which like every
evictor keeps hot and planned copies: ``router/placement/evictors.py``), so benchmarks compare
placement, not eviction.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

from router.placement.costs import CostModel
from router.placement.default import DefaultPolicy
from router.placement.evictors import EVICTORS, LruIdleEvictor
from router.placement.filters import FILTERS, CanHostFilter, ExcludeFilter, HealthyFilter
from router.placement.framework import Evictor, Filter, Picker, SchedulerProfile, Scorer
from router.placement.pickers import (
    PICKERS,
    MaxScorePicker,
    MaxScoreRandomTiePicker,
    RandomPicker,
    RoundRobinPicker,
)
from router.placement.scorers import (
    SCORERS,
    GieLoraAffinityScorer,
    KvCacheScorer,
    LeastRequestScorer,
    PrefixCacheScorer,
    QueueScorer,
)
from router.placement.types import Profile


def _filters() -> list[Filter]:
    return [HealthyFilter(), ExcludeFilter(), CanHostFilter()]


def default_profile(
    *, evictor: Any = "cost-aware-keep-hot", choices: int = 4, holders: int = 8, **params: Any
) -> DefaultPolicy:
    """loraplane's default policy (``default.py``; README.md has the cost table): the cost
    model's fields (``CostModel``), ``choices``, ``holders`` and ``evictor`` (a name or
    ``[name, {params}]`` of the registered evictors)."""
    costs, rest = CostModel.from_params(dict(params))
    if rest:
        raise ValueError(f"unknown parameters for the default profile: {sorted(rest)}")
    for k, v in (("choices", choices), ("holders", holders)):
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise ValueError(f"default profile: {k} must be an integer >= 1, got {v!r}")
    ev: Evictor = plugin(EVICTORS, "evictor", evictor)[0]
    return DefaultPolicy(costs, ev, choices=choices, holders=holders)


def round_robin_profile() -> SchedulerProfile:
    return SchedulerProfile("round-robin", _filters(), [], RoundRobinPicker(), LruIdleEvictor())


def least_request_profile() -> SchedulerProfile:
    return SchedulerProfile(
        "least-request", _filters(), [(LeastRequestScorer(), 1.0)], MaxScorePicker(), LruIdleEvictor()
    )


def random_profile(*, seed: int | None = 0) -> SchedulerProfile:
    return SchedulerProfile("random", _filters(), [], RandomPicker(seed), LruIdleEvictor())


def gie_profile(
    *,
    seed: int | None = 0,
    lora_weight: float = 1.0,
    queue_weight: float = 1.0,
    kv_weight: float = 1.0,
    count: str = "union",
) -> SchedulerProfile:
    """GIE-style LoRA affinity (weights default to GIE's scorer defaults, 1 : 1 : 1)."""
    scorers: list[tuple[Scorer, float]] = [
        (GieLoraAffinityScorer(count), lora_weight),
        (QueueScorer(), queue_weight),
        (KvCacheScorer(), kv_weight),
    ]
    return SchedulerProfile(
        "gie-lora-affinity", _filters(), scorers, MaxScoreRandomTiePicker(seed), LruIdleEvictor()
    )


def llm_d_profile(
    *,
    seed: int | None = 0,
    queue_weight: float = 2.0,
    kv_weight: float = 2.0,
    prefix_weight: float = 3.0,
    lora_weight: float = 1.0,
) -> SchedulerProfile:
    """The llm-d router's default scorer set: queue (2) + KV-cache utilisation (2) + prefix
    cache (3, the prefix hashed with the adapter's name) + LoRA affinity (1); max-score picker
    with random tie-break."""
    scorers: list[tuple[Scorer, float]] = [
        (QueueScorer(), queue_weight),
        (KvCacheScorer(), kv_weight),
        (PrefixCacheScorer(), prefix_weight),
        (GieLoraAffinityScorer(), lora_weight),
    ]
    return SchedulerProfile("llm-d", _filters(), scorers, MaxScoreRandomTiePicker(seed), LruIdleEvictor())


def plugin(registry: Mapping[str, type[Any]], kind: str, spec: Any) -> tuple[Any, list[Any]]:
    """Parse ``name`` | ``[name, ...rest]`` into (instance from ``registry``, rest)."""
    rest: list[Any] = []
    params: dict[str, Any]
    if isinstance(spec, str):
        name, params = spec, {}
    elif isinstance(spec, list | tuple) and spec and isinstance(spec[0], str):
        name = spec[0]
        rest = list(spec[1:])
        params = rest.pop() if rest and isinstance(rest[-1], dict) else {}
    else:
        raise ValueError(f"bad {kind} spec: {spec!r}")
    cls = registry.get(name)
    if cls is None:
        raise ValueError(f"unknown {kind} {name!r}; known: {sorted(registry)}")
    try:
        return cls(**params), rest
    except TypeError as exc:
        raise ValueError(f"bad parameters for {kind} {name!r}: {exc}") from None


def custom_profile(
    *,
    filters: list[Any] | None = None,
    scorers: list[Any] | None = None,
    picker: Any = "max-score",
    evictor: Any = "lru-idle",
    name: str = "custom",
) -> SchedulerProfile:
    """A pipeline assembled from the plugin registries (FILTERS, SCORERS, PICKERS, EVICTORS)."""
    fs = [plugin(FILTERS, "filter", f)[0] for f in (filters or ["healthy", "exclude", "can-host"])]
    if not any(isinstance(f, CanHostFilter) for f in fs):
        fs.append(CanHostFilter())  # never evict an adapter with requests in flight
    ss: list[tuple[Scorer, float]] = []
    for spec in scorers or []:
        scorer, rest = plugin(SCORERS, "scorer", spec)
        weight = float(rest[0]) if rest else 1.0
        ss.append((scorer, weight))
    pk: Picker = plugin(PICKERS, "picker", picker)[0]
    ev: Evictor = plugin(EVICTORS, "evictor", evictor)[0]
    return SchedulerProfile(name, fs, ss, pk, ev)


PROFILES: dict[str, Callable[..., Profile]] = {
    "default": default_profile,
    "round-robin": round_robin_profile,
    "least-request": least_request_profile,
    "random": random_profile,
    "gie-lora-affinity": gie_profile,
    "llm-d": llm_d_profile,
    "custom": custom_profile,
}

BASELINES = ("round-robin", "least-request", "random", "gie-lora-affinity", "llm-d")


def make_profile(name: str, **params: Any) -> Profile:
    """A fresh instance of the profile ``name`` with ``params`` (ValueError on unknown/bad ones)."""
    factory = PROFILES.get(name)
    if factory is None:
        raise ValueError(f"unknown placement profile {name!r}; known: {sorted(PROFILES)}")
    try:
        return factory(**params)
    except TypeError as exc:
        raise ValueError(f"bad parameters for placement profile {name!r}: {exc}") from None


def profile_from_config(name: str, params: str | Mapping[str, Any] | None = None) -> Profile:
    """``make_profile`` from settings: ``params`` may be a JSON object string, a mapping or None."""
    if params is None or params == "":
        parsed: dict[str, Any] = {}
    elif isinstance(params, str):
        try:
            loaded = json.loads(params)
        except json.JSONDecodeError as exc:
            raise ValueError(f"LORAPLANE_PLACEMENT_PARAMS is not valid JSON: {exc}") from None
        if not isinstance(loaded, dict):
            raise ValueError("LORAPLANE_PLACEMENT_PARAMS must be a JSON object")
        parsed = loaded
    else:
        parsed = dict(params)
    return make_profile(name, **parsed)
