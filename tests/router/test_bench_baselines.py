"""The routing benchmark's baselines (``benchmarks/baselines``) and workloads (``benchmarks/workloads``)."""

from __future__ import annotations

import itertools
from collections import Counter

import numpy as np
import pytest

from benchmarks import workloads as wl
from benchmarks.baselines import make_bench_profile
from benchmarks.baselines.dynamo import DynamoController, DynamoParams, hrw_order
from benchmarks.replay import ClusterConfig, jain, prompt_blocks, replay
from benchmarks.traces import TraceRequest
from router.placement import PlacementRequest, ReplicaView, Residency, make_profile


def _view(
    url: str,
    residents: tuple[str, ...] = (),
    *,
    running: tuple[str, ...] = (),
    waiting: int = 0,
    max_adapters: int = 8,
) -> ReplicaView:
    res = {
        n: Residency(lora_name=n, state="resident", adapter_id=n, inflight=1 if n in running else 0)
        for n in residents
    }
    return ReplicaView(
        url=url,
        pool="p",
        healthy=True,
        max_loras=4,
        max_adapters=max_adapters,
        residents=res,
        inflight=len(running),
        waiting=waiting,
        lora_running=running,
        lora_waiting=running,
    )


# ---------------------------------------------------------------- Dynamo-style controller


def test_hrw_replica_sets_move_only_where_a_server_joins_or_leaves() -> None:
    servers = [f"http://s{i}" for i in range(10)]
    names = [f"lora-{i}" for i in range(500)]
    before = {n: hrw_order(n, servers)[:3] for n in names}
    gone = "http://s3"
    after = {n: hrw_order(n, [s for s in servers if s != gone])[:3] for n in names}
    for n in names:
        if gone in before[n]:  # the survivors keep their order; one new server fills the gap
            assert [s for s in before[n] if s != gone] == after[n][:2]
        else:
            assert after[n] == before[n]
    joined = {n: hrw_order(n, [*servers, "http://s10"])[:3] for n in names}
    moved = [n for n in names if joined[n] != before[n]]
    assert all("http://s10" in joined[n] for n in moved)
    assert 0.2 < len(moved) / len(names) < 0.4  # about 3/11 of the sets gain the new server
    assert hrw_order("x", servers) == hrw_order("x", list(reversed(servers)))  # order-independent


def test_dynamo_copies_follow_demand_with_scale_down_hysteresis_and_a_slot_budget() -> None:
    views = [_view(f"http://r{i}") for i in range(4)]
    c = DynamoController(DynamoParams(tick_s=1.0, ema=1.0, down_ticks=3, slot_share=0.5))  # budget 4/server
    for name, n in (("hot", 80), ("b", 10), ("c", 10)):
        for _ in range(n):
            c.observe(name)
    c.tick(views)
    assert len(c.targets["hot"]) == 4  # ceil(0.8 × 4)
    assert len(c.targets["b"]) == 1 and len(c.targets["c"]) == 1
    copies = []
    for _ in range(3):  # demand evens out: "hot" wants 2 copies; it drops only on the 3rd tick
        for name in ("hot", "b", "c"):
            for _ in range(10):
                c.observe(name)
        c.tick(views)
        copies.append(len(c.targets["hot"]))
    assert copies == [4, 4, 2]
    for i in range(20):  # more adapters than slots: the budget caps the planned copies per server
        for _ in range(5):
            c.observe(f"x{i}")
    c.tick(views)
    per_server = Counter(s for t in c.targets.values() for s in t)
    assert max(per_server.values()) <= 4 and sum(per_server.values()) == 16 and len(c.targets) < 20


def test_dynamo_keeps_its_replica_sets_when_demand_is_steady() -> None:
    views = [_view(f"http://r{i}") for i in range(6)]
    c = DynamoController(DynamoParams(tick_s=1.0))
    for tick in range(4):
        for i in range(20):
            for _ in range(1 + (i % 5)):
                c.observe(f"a{i}")
        c.tick(views)
        if tick == 0:
            first, moves = dict(c.targets), c.moves
    assert c.targets == first and c.moves == moves  # keep_reward: nothing moved after the first plan


def test_dynamo_profile_routes_within_the_set_by_kv_cost() -> None:
    prof = make_bench_profile("dynamo", tick_s=1.0)
    views = [_view(f"http://r{i}", ("hot",)) for i in range(4)]
    req = PlacementRequest(lora_name="hot", adapter_id="hot", prompt_tokens=1000)
    for t in range(40):  # one tick's worth of demand, then the plan: all 4 servers
        prof.pick(req, views, t * 0.05)
    d = prof.pick(req, views, 2.5)
    ctl = prof.picker.controller  # type: ignore[attr-defined]
    assert set(ctl.targets["hot"]) == {v.url for v in views} and d.action == "hit"
    with_prefix = PlacementRequest(
        lora_name="hot", adapter_id="hot", prompt_tokens=1000, prefix={"http://r2": 900}
    )
    assert prof.pick(with_prefix, views, 2.6).replica == "http://r2"
    cold = PlacementRequest(lora_name="cold", adapter_id="cold", prompt_tokens=10)
    assert prof.pick(cold, views, 2.7).replica == hrw_order("cold", [v.url for v in views])[0]


# ---------------------------------------------------------------- llm-d default scorers and the oracle


def test_llm_d_prefers_the_replica_running_the_adapter_and_holding_the_prefix() -> None:
    prof = make_bench_profile("llm-d", seed=0)
    full = ("a", "b", "c", "d")  # lists max_loras adapters: no room for another there
    views = [
        _view("http://r0", full, running=full),
        _view("http://r1", (*full[1:], "x"), running=(*full[1:], "x")),
    ]
    plain = PlacementRequest(lora_name="a", adapter_id="a", prompt_tokens=1000)
    assert prof.pick(plain, views, 0.0).replica == "http://r0"  # LoRA affinity: "a" runs there
    cached = PlacementRequest(lora_name="a", adapter_id="a", prompt_tokens=1000, prefix={"http://r1": 900})
    assert prof.pick(cached, views, 0.0).replica == "http://r1"  # prefix (weight 3) beats affinity (1)
    busy = [_view("http://r0", full, running=full, waiting=20), _view("http://r1", full, running=full)]
    assert prof.pick(plain, busy, 0.0).replica == "http://r1"  # queue (2): the shorter waiting queue


def test_prefix_oracle_takes_the_longest_prefix_among_holders() -> None:
    prof = make_bench_profile("prefix-oracle")
    views = [_view("http://r0", ("a",)), _view("http://r1"), _view("http://r2", ("a",))]
    req = PlacementRequest(
        lora_name="a",
        adapter_id="a",
        prompt_tokens=1000,
        prefix={"http://r1": 990, "http://r2": 500, "http://r0": 100},
    )
    assert prof.pick(req, views, 0.0).replica == "http://r2"  # r1 has more, but not the adapter


# ---------------------------------------------------------------- workloads


def test_workloads_are_seeded_and_reproducible() -> None:
    for name in wl.WORKLOADS:
        a = wl.make(name, duration_s=60, seed=3)
        assert a == wl.make(name, duration_s=60, seed=3), name
        assert a != wl.make(name, duration_s=60, seed=4), name
        assert all(x.t <= y.t for x, y in itertools.pairwise(a)) and a[0].t >= 0 and a[-1].t < 60
    with pytest.raises(ValueError):
        wl.make("nope")


def _top_share(trace: list[TraceRequest]) -> float:
    return Counter(r.adapter for r in trace).most_common(1)[0][1] / len(trace)


def test_workload_shapes_are_as_claimed() -> None:
    d = 600.0
    assert _top_share(wl.make("zipf-1.2", duration_s=d)) > 3 * _top_share(wl.make("zipf-0.3", duration_s=d))
    day = wl.make("diurnal", duration_s=d)
    times = np.array([r.t for r in day])
    edge, mid = np.sum(times < d / 6) + np.sum(times > 5 * d / 6), np.sum(np.abs(times - d / 2) < d / 6)
    assert mid > 3 * edge  # peak in the middle of the "day", troughs at both ends
    fc = wl.make("flash-crowd", duration_s=d)
    window = [r for r in fc if 0.4 * d <= r.t < 0.55 * d]
    crowd = {a for a, _ in Counter(r.adapter for r in window).most_common(4)}
    in_window = sum(r.adapter in crowd for r in window) / len(window)
    before = sum(r.adapter in crowd for r in fc if r.t < 0.4 * d)
    assert in_window > 0.6 and before < 0.01 * len(fc)  # cold adapters, then 3× the background
    bins = np.bincount((np.array([r.t for r in wl.make("mmpp", duration_s=d)]) // 5).astype(int))
    assert bins.var() / bins.mean() > 3  # overdispersed: bursts (a Poisson process gives ~1)
    sp = wl.make("shared-prefix", duration_s=d)
    by_adapter: dict[str | None, set[int]] = {}
    sessions: dict[str, list[TraceRequest]] = {}
    for r in sp:
        by_adapter.setdefault(r.adapter, set()).add(r.system_tokens)
        sessions.setdefault(r.session, []).append(r)
        assert 512 <= r.system_tokens < r.prompt_tokens
    assert all(len(s) == 1 for s in by_adapter.values())  # one system prompt per adapter
    multi = [s for s in sessions.values() if len(s) > 1]
    assert len(multi) > len(sessions) / 3
    for s in multi:  # each turn's prompt holds the previous turn's prompt and answer
        assert len({r.adapter for r in s}) == 1
        for x, y in itertools.pairwise(s):
            assert y.prompt_tokens >= min(8192, x.prompt_tokens + x.output_tokens)
    ht = wl.make("heavy-tenant", duration_s=d)
    tenants = Counter(r.tenant for r in ht)
    assert 0.4 < tenants["heavy"] / len(ht) < 0.6 and len(tenants) == 41
    assert len({r.adapter for r in ht if r.tenant == "heavy"}) == 4


# ---------------------------------------------------------------- replay: prefix cache, tiers, fairness


def test_prompt_blocks_are_keyed_by_adapter_and_shared_along_a_session() -> None:
    t1 = TraceRequest(0.0, "a", 1000, 50, "", 512, "s1")
    t2 = TraceRequest(1.0, "a", 1100, 50, "", 512, "s1")
    other = TraceRequest(1.0, "b", 1000, 50, "", 512, "s1")
    stranger = TraceRequest(1.0, "a", 1000, 50, "", 512, "s2")
    b1, b2 = prompt_blocks(t1, 0), prompt_blocks(t2, 1)
    assert b2[: len(b1)] == b1 and len(b2) == 1100 // 16
    assert not set(prompt_blocks(other, 2)) & set(b1)  # vLLM keys blocks by lora_name
    assert prompt_blocks(stranger, 3)[:32] == b1[:32] and prompt_blocks(stranger, 3)[32] != b1[32]
    assert prompt_blocks(TraceRequest(0.0, "a", 1000, 50), 0) == []


def test_replay_counts_prefill_saved_tiers_and_fairness() -> None:
    trace = wl.make("shared-prefix", duration_s=40, seed=1)
    cfg = ClusterConfig(replicas=2, max_adapters=8, max_cpu_loras=4, prefix_cache_blocks=2048)
    rr = replay(trace, make_profile("round-robin"), cfg)
    oracle = replay(trace, make_bench_profile("prefix-oracle"), cfg, prefix_source="engine")
    for r in (rr, oracle):
        assert r.completed == len(trace) and r.prompt_tokens == sum(x.prompt_tokens for x in trace)
        assert 0 < r.prefill_tokens < r.prompt_tokens  # the shared prompts are cached
        assert r.churn == r.loads + r.evictions and 0 < r.jain_ttft <= 1
        assert r.decision_us_mean > 0
    assert oracle.prefill_tokens < rr.prefill_tokens
    none = replay(trace, make_profile("round-robin"), ClusterConfig(replicas=2, max_adapters=8))
    assert none.prefill_tokens == none.prompt_tokens  # no prefix cache: every token computed
    with pytest.raises(ValueError):
        replay(trace, make_profile("round-robin"), cfg, prefix_source="psychic")


def test_jain_index() -> None:
    assert jain([2.0, 2.0, 2.0]) == pytest.approx(1.0)
    assert jain([1.0, 0.0, 0.0, 0.0]) == pytest.approx(0.25)
    assert 0.25 < jain([1.0, 2.0, 3.0, 4.0]) < 1
