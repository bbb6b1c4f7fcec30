"""Baselines of the routing benchmark beyond ``router.placement``'s own profiles (issue 28.7).

Each is a placement ``Profile`` (``router.placement.types``), so ``benchmarks/replay.py`` drives
it exactly like loraplane's policies:

- ``dynamo`` — a Dynamo-style placement controller (``dynamo.py``): HRW replica sets, an EMA
  demand predictor, demand-proportional copies with hysteresis and a slot budget, greedy
  ``α·rank + γ·new_load − β·keep`` assignment, KV-aware routing within the set;
- ``llm-d`` — today's llm-d router default scorer set (``llm_d.py``): queue, KV utilisation,
  prefix cache keyed by adapter, LoRA affinity;
- ``prefix-oracle`` — the reference for prefill computed (``oracle.py``): the replica holding the
  adapter with the longest *true* cached prefix.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from benchmarks.baselines.dynamo import dynamo
from benchmarks.baselines.llm_d import llm_d
from benchmarks.baselines.oracle import prefix_oracle
from router.placement.types import Profile

BENCH_PROFILES: dict[str, Callable[..., Profile]] = {
    "dynamo": dynamo,
    "llm-d": llm_d,
    "prefix-oracle": prefix_oracle,
}


def make_bench_profile(name: str, **params: Any) -> Profile:
    factory = BENCH_PROFILES.get(name)
    if factory is None:
        raise ValueError(f"unknown benchmark baseline {name!r}; known: {sorted(BENCH_PROFILES)}")
    return factory(**params)
