"""The routing benchmark's offline lower bound on loads (benchmarks/bounds.py) and its use."""

from __future__ import annotations

import json
import random
from functools import cache
from pathlib import Path

import pytest

from benchmarks.bounds import belady_min, bounds, compulsory, lfu_misses, lru_misses
from benchmarks.routing import ClusterConfig, main, replay
from benchmarks.traces import TraceSpec, generate
from router.placement import make_profile


def optimal_misses(seq: tuple[str, ...], capacity: int) -> int:
    """Fewest misses of any demand-paging cache, by exhaustive search over eviction choices."""

    @cache
    def best(i: int, held: frozenset[str]) -> int:
        if i == len(seq):
            return 0
        x = seq[i]
        if x in held:
            return best(i + 1, held)
        if len(held) < capacity:
            return 1 + best(i + 1, held | {x})
        return 1 + min(best(i + 1, (held - {v}) | {x}) for v in held)

    return best(0, frozenset())


def test_belady_min_is_the_optimum_on_small_sequences() -> None:
    rng = random.Random(1)
    for _ in range(300):
        names = [f"a{k}" for k in range(rng.randint(1, 5))]
        seq = tuple(rng.choice(names) for _ in range(rng.randint(0, 12)))
        capacity = rng.randint(1, 3)
        want = optimal_misses(seq, capacity)
        assert belady_min(seq, capacity) == want, (seq, capacity)
        assert compulsory(seq) <= want <= min(lru_misses(seq, capacity), lfu_misses(seq, capacity))


def test_known_sequences() -> None:
    seq = ["a", "b", "c", "a", "b", "d", "a", "b", "c", "d"]
    # MIN with 3 slots: a b c (3); d evicts c, requested farthest ahead (4); c evicts a or b,
    # never requested again (5); d hits.
    assert belady_min(seq, 3) == 5
    assert lru_misses(seq, 3) == 6  # d evicts c, then c evicts d, then d evicts a
    assert compulsory(seq) == 4
    assert belady_min(seq, 4) == 4 == lru_misses(seq, 4)  # everything fits: compulsory only
    # LFU keeps the adapter asked for most even when it was not asked for lately; LRU does not.
    seq2 = ["hot", "hot", "hot", "x", "y", "hot"]
    assert lfu_misses(seq2, 2) == 3 and lru_misses(seq2, 2) == 4
    # Base-model requests (None) cost nothing.
    assert belady_min([None, "a", None, "a"], 1) == 1 == compulsory([None, "a", None, "a"])
    with pytest.raises(ValueError):
        belady_min(seq, 0)


def test_no_profile_beats_the_bound_on_a_short_trace() -> None:
    # Light enough that no request is refused and retried later (which would serve the trace out
    # of order; the bound is for the trace's order).
    cfg = ClusterConfig(replicas=2, max_loras=4, max_adapters=6)
    trace = generate(TraceSpec(n_adapters=40, alpha=1.0, rate=1.0, duration_s=80.0, seed=3))
    b = bounds([r.adapter for r in trace], cfg.replicas * cfg.max_adapters)
    assert b["compulsory"] <= b["belady_min"] <= min(b["lru_one_cache"], b["lfu_one_cache"])
    assert b["belady_min"] > b["compulsory"]  # the trace does not fit: evictions are needed
    for name in ("default", "round-robin", "least-request", "random", "gie-lora-affinity"):
        r = replay(trace, make_profile(name), cfg)
        assert r.completed == len(trace) and r.failed == 0 and "no-capacity" not in r.decisions
        assert r.loads >= b["belady_min"], name


def test_routing_benchmark_reports_the_bound_and_each_profile_against_it(tmp_path: Path) -> None:
    out = tmp_path / "routing.json"
    args = ["--workloads", "zipf-1.2,shared-prefix", "--duration", "20", "--replicas", "2", "--jobs", "1"]
    args += ["--max-adapters", "4", "--profiles", "default,round-robin,dynamo,llm-d", "--no-scaling"]
    assert main([*args, "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    zipf, prefix = report["runs"]
    for run in (zipf, prefix):
        b = run["bound"]
        assert b["capacity"] == 8 and 0 < b["compulsory"] <= b["belady_min"]
        rows = {r["profile"]: r for r in run["results"]}
        for r in rows.values():
            assert r["loads_vs_min"] == pytest.approx(r["loads"] / b["belady_min"])
    assert {r["profile"] for r in zipf["results"]} == {"default", "round-robin", "dynamo", "llm-d"}
    assert "prefix-oracle" in {r["profile"] for r in prefix["results"]}
    targets = report["targets"]["per_trace"]
    assert {"loads_vs_anchor", "p99_vs_anchor", "loads_vs_min", "p99_vs_rr"} <= set(targets["zipf-1.2"])
    assert "prefill_vs_oracle" in targets["shared-prefix"]
