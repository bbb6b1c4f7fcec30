"""The simulated engine's prefix cache per lora_name and its CPU tier (virtual time, exact)."""

from __future__ import annotations

import math

import pytest

from simulator.engine import EngineModel, TimingParams
from simulator.prefix_cache import PrefixCache, prompt_blocks
from simulator.tiers import TierCosts

SYSTEM = "You answer questions about the accounts of the cooperative. " * 40  # 2,400 characters


def _params(**kw: object) -> TimingParams:
    base: dict[str, object] = dict(
        load_fixed_s=0.0,
        load_bytes_per_s=math.inf,
        cpu_cache_reload_s=0.0,
        prefill_s_per_token=0.001,
        decode_base_s=0.01,
        decode_per_seq_s=0.0,
    )
    base.update(kw)
    return TimingParams(**base)  # type: ignore[arg-type]


def first_token(
    eng: EngineModel, rid: str, lora: str | None, tokens: int, prefix: list[int], at: float
) -> float:
    eng.add_request(rid, lora, tokens, 1, at, prefix=prefix)
    events = eng.advance(at + 10.0)
    return next(e.time for e in events if e.kind == "first_token" and e.req_id == rid) - at


def test_a_repeated_prefix_of_the_same_lora_skips_its_prefill() -> None:
    eng = EngineModel(_params(max_loras=2), prefix_cache=PrefixCache(10_000))
    eng.register_adapter("A", 0, 0.0)
    eng.register_adapter("B", 0, 0.0)
    blocks_a = prompt_blocks("A", SYSTEM)
    tokens = len(SYSTEM) // 4  # 600
    cold = first_token(eng, "r1", "A", tokens, blocks_a, 0.0)
    assert cold == pytest.approx(0.01 + 0.001 * tokens)
    warm = first_token(eng, "r2", "A", tokens, blocks_a, 20.0)
    cached = len(blocks_a) * 16  # 37 full blocks of 16 tokens
    assert warm == pytest.approx(0.01 + 0.001 * (tokens - cached))  # only the tail is prefilled
    other = first_token(eng, "r3", "B", tokens, prompt_blocks("B", SYSTEM), 40.0)
    assert other == pytest.approx(cold)  # another adapter: its own blocks
    assert eng.prefill_tokens == tokens + (tokens - cached) + tokens
    cache = eng.prefix_cache
    assert cache is not None and cache.hit_tokens == cached and cache.queried_tokens == 3 * tokens


def test_the_cache_is_an_lru_over_blocks() -> None:
    cache = PrefixCache(capacity_blocks=4, block_tokens=16)
    a, b = [1, 2, 3], [7, 8]
    cache.insert(a)
    assert cache.lookup(a, 100) == 48
    cache.insert(b)  # 5 blocks > 4: the least recently used (1) goes
    assert cache.lookup(a, 100) == 0  # the chain breaks at its first block
    assert cache.lookup([2, 3], 100) == 32
    assert cache.lookup(b, 20) == 19  # never the whole prompt
    assert len(cache) == 4
    with pytest.raises(ValueError):
        PrefixCache(0)


def test_blocks_are_chained_and_keyed_by_the_served_name() -> None:
    a = prompt_blocks("A", SYSTEM)
    assert len(a) == len(SYSTEM) // 64
    assert prompt_blocks("A", SYSTEM + "and more")[: len(a)] == a
    assert not set(a) & set(prompt_blocks("B", SYSTEM))


def test_a_cpu_tier_hit_costs_a_size_aware_copy_padded_to_max_lora_rank() -> None:
    tiers = TierCosts(cpu_fixed_s=0.001, pcie_bytes_per_s=1e9, max_lora_rank=64, ranks={"small": 8})
    eng = EngineModel(_params(max_loras=1, max_cpu_loras=3, prefill_s_per_token=0.0), tiers=tiers)
    for name in ("big", "small", "x"):
        eng.register_adapter(name, 10_000_000, 0.0)
    # "x" holds the GPU slot; "big" and "small" wait in the host cache
    t_big = first_token(eng, "b", "big", 1, [], 1.0)
    assert t_big == pytest.approx(0.01 + 0.001 + 0.01)  # 10 MB at 1 GB/s
    t_small = first_token(eng, "s", "small", 1, [], 2.0)
    assert t_small == pytest.approx(0.01 + 0.001 + 0.08)  # rank 8 padded to 64: 8× the bytes
    assert eng.total_cpu_reloads == 2
    assert tiers.cpu_to_gpu_s("unknown", 0) == 0.001
