"""Named placement profiles and ``make_profile`` (selection by configuration).

``make_profile(name, **params)`` returns a fresh :class:`SchedulerProfile` (each instance holds
its own RNG / round-robin counter). Profiles:

- ``default`` — loraplane's policy: resident affinity with demand-driven replication and
  hysteresis, running-set (max_loras) awareness, free registration slots then the cheapest
  eviction (``eviction-cost``), load; cost-aware eviction (frequency × recency × reload time).
- ``round-robin``, ``least-request``, ``random`` — baselines.
- ``gie-lora-affinity`` — the Gateway API Inference Extension's lora-affinity + queue +
  kv-cache scorers, max-score picker with random tie-break.
- ``custom`` — any pipeline from the plugin registries: ``filters=[...]``,
  ``scorers=[[name, weight, {params}], ...]``, ``picker=name`` or ``[name, {params}]``,
  ``evictor=name`` or ``[name, {params}]``.

All baselines use the same filters (healthy, exclude, can-host) and the same LRU idle eviction
(``lru-idle``, which like every evictor keeps hot copies: ``router/placement/evictors.py``), so
benchmarks compare placement, not eviction.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

from router.placement.evictors import (
    EVICTORS,
    CostAwareEvictor,
    EvictionCostScorer,
    HotCopyEvictor,
    LruIdleEvictor,
)
from router.placement.filters import FILTERS, CanHostFilter, ExcludeFilter, HealthyFilter
from router.placement.framework import Evictor, Filter, Picker, SchedulerProfile, Scorer
from router.placement.fused import DefaultProfile
from router.placement.pickers import (
    PICKERS,
    MaxScorePicker,
    MaxScoreRandomTiePicker,
    RandomPicker,
    RoundRobinPicker,
)
from router.placement.scorers import (
    SCORERS,
    FreeSlotScorer,
    GieLoraAffinityScorer,
    KvCacheScorer,
    LeastRequestScorer,
    LoadScorer,
    QueueScorer,
    ResidencyAffinityScorer,
    RunningSetScorer,
)


def _filters() -> list[Filter]:
    return [HealthyFilter(), ExcludeFilter(), CanHostFilter()]


DEFAULT_WEIGHTS: dict[str, float] = {
    "resident-affinity": 3.0,
    "running-set": 2.0,
    "eviction-cost": 2.0,  # with the cost-aware evictor (the default)
    "free-slot": 1.0,  # with any other evictor, in eviction-cost's place
    "load": 1.0,
}
DEFAULT_EVICTOR = "cost-aware-keep-hot"


def default_profile(
    *,
    weights: Mapping[str, float] | None = None,
    high_water: float = 0.75,
    adapter_high: float = 0.25,
    low_water: float = 0.05,
    idle_horizon_s: float = 60.0,
    evictor: Any = DEFAULT_EVICTOR,
) -> SchedulerProfile:
    """loraplane's default policy (see README.md for the tables).

    ``evictor`` names a registered evictor (``name`` or ``[name, {params}]``); the keep-hot ones
    take the profile's ``low_water`` unless their params set it. With ``cost-aware-keep-hot`` the
    third scorer is ``eviction-cost`` (pricing evictions as that evictor does), with any other
    ``free-slot`` (``idle_horizon_s``); ``weights`` may name both, the one not used is ignored."""
    w = dict(DEFAULT_WEIGHTS)
    if weights:
        unknown = set(weights) - set(w)
        if unknown:
            raise ValueError(f"unknown scorer weights for the default profile: {sorted(unknown)}")
        w.update({k: float(v) for k, v in weights.items()})
    if isinstance(evictor, str):
        evictor = [evictor, {}]
    if isinstance(evictor, list | tuple) and evictor and isinstance(evictor[0], str):
        cls = EVICTORS.get(evictor[0])
        params = evictor[-1] if len(evictor) > 1 and isinstance(evictor[-1], dict) else {}
        if cls is not None and issubclass(cls, HotCopyEvictor) and "low_water" not in params:
            evictor = [evictor[0], {**params, "low_water": low_water}]
    ev: Evictor = _plugin(EVICTORS, "evictor", evictor)[0]
    slot: tuple[Scorer, float] = (
        (EvictionCostScorer(ev), w["eviction-cost"])
        if isinstance(ev, CostAwareEvictor)
        else (FreeSlotScorer(idle_horizon_s), w["free-slot"])
    )
    scorers: list[tuple[Scorer, float]] = [
        (ResidencyAffinityScorer(high_water, adapter_high, low_water), w["resident-affinity"]),
        (RunningSetScorer(), w["running-set"]),
        slot,
        (LoadScorer(), w["load"]),
    ]
    return DefaultProfile("default", _filters(), scorers, MaxScorePicker(), ev)


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


# The scorer registry plus eviction-cost (defined with the evictor whose prices it reads).
_SCORERS: dict[str, type[Scorer]] = {**SCORERS, EvictionCostScorer.name: EvictionCostScorer}


def _plugin(registry: Mapping[str, type[Any]], kind: str, spec: Any) -> tuple[Any, list[Any]]:
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
    fs = [_plugin(FILTERS, "filter", f)[0] for f in (filters or ["healthy", "exclude", "can-host"])]
    if not any(isinstance(f, CanHostFilter) for f in fs):
        fs.append(CanHostFilter())  # never evict an adapter with requests in flight
    ss: list[tuple[Scorer, float]] = []
    for spec in scorers or []:
        scorer, rest = _plugin(_SCORERS, "scorer", spec)
        weight = float(rest[0]) if rest else 1.0
        ss.append((scorer, weight))
    pk: Picker = _plugin(PICKERS, "picker", picker)[0]
    ev: Evictor = _plugin(EVICTORS, "evictor", evictor)[0]
    return SchedulerProfile(name, fs, ss, pk, ev)


PROFILES: dict[str, Callable[..., SchedulerProfile]] = {
    "default": default_profile,
    "round-robin": round_robin_profile,
    "least-request": least_request_profile,
    "random": random_profile,
    "gie-lora-affinity": gie_profile,
    "custom": custom_profile,
}

BASELINES = ("round-robin", "least-request", "random", "gie-lora-affinity")


def make_profile(name: str, **params: Any) -> SchedulerProfile:
    """A fresh instance of the profile ``name`` with ``params`` (ValueError on unknown/bad ones)."""
    factory = PROFILES.get(name)
    if factory is None:
        raise ValueError(f"unknown placement profile {name!r}; known: {sorted(PROFILES)}")
    try:
        return factory(**params)
    except TypeError as exc:
        raise ValueError(f"bad parameters for placement profile {name!r}: {exc}") from None


def profile_from_config(name: str, params: str | Mapping[str, Any] | None = None) -> SchedulerProfile:
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
