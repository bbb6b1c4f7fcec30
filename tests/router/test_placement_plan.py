"""The placement plan (``router/placement/plan.py``) and the forecast: pure functions of a snapshot."""

from __future__ import annotations

import pytest

from router.placement.forecast import Forecaster
from router.placement.plan import Demand, Plan, PlanParams, actions, make_plan
from router.placement.table import ReplicaTable
from router.placement.types import ReplicaView
from tests.router.test_placement_support import res, view


def table(
    n: int, *, max_adapters: int = 8, max_loras: int = 4, pool: str = "p", **held: list[str]
) -> ReplicaTable:
    t = ReplicaTable()
    for i in range(n):
        url = f"http://r{i}"
        t.put(
            view(
                url, *(res(a) for a in held.get(f"r{i}", [])), max_adapters=max_adapters, max_loras=max_loras
            )
        )
    return t


def demand(name: str, rate: float, *, inflight: int = 0, hot: int = 0) -> Demand:
    return Demand(name, name, "v1", "base", rate, inflight=inflight, min_copies=hot)


def test_planned_adapters_get_copies_by_concurrency_and_hot_ones_their_count() -> None:
    t = table(4, max_adapters=8)
    params = PlanParams(copy_share=0.25)  # one copy per 25 concurrent requests (max_num_seqs 100)
    plan = make_plan(
        {"base": t},
        [demand("busy", 10.0, inflight=60), demand("calm", 1.0, inflight=1), demand("hot", 0.0, hot=2)],
        None,
        params,
        0.0,
    )
    assert len(plan.targets["busy"]) == 3  # ceil(60 / 25)
    assert len(plan.targets["calm"]) == 1
    assert len(plan.targets["hot"]) == 2
    assert plan.demand["busy"] == 10.0 and plan.adapters["busy"] == ("busy", "v1")


def test_the_plan_fills_at_most_plan_share_of_each_replica_and_hot_ones_may_fill_it() -> None:
    t = table(2, max_adapters=4)
    demands = [demand(f"a{i}", 1.0 + i) for i in range(10)]
    plan = make_plan({"base": t}, demands, None, PlanParams(plan_share=0.5), 0.0)
    per: dict[str, int] = {}
    for urls in plan.targets.values():
        for u in urls:
            per[u] = per.get(u, 0) + 1
    assert per == {"http://r0": 2, "http://r1": 2}
    assert set(plan.targets) == {"a9", "a8", "a7", "a6"}  # the busiest
    assert plan.overflow == 6
    hot = make_plan(
        {"base": t}, [demand(f"h{i}", 0.0, hot=1) for i in range(8)], None, PlanParams(plan_share=0.5), 0.0
    )
    assert sum(len(v) for v in hot.targets.values()) == 8  # every slot


def test_a_plan_repeated_on_the_same_demand_moves_nothing() -> None:
    t = table(6)
    demands = [demand(f"a{i}", 0.5 + i, inflight=i) for i in range(20)]
    first = make_plan({"base": t}, demands, None, PlanParams(), 0.0)
    second = make_plan({"base": t}, demands, first, PlanParams(), 3.0)
    assert second.targets == first.targets


def test_a_replica_leaving_moves_only_the_adapters_it_held() -> None:
    t = table(8)
    demands = [demand(f"a{i}", 1.0 + i % 5) for i in range(30)]
    first = make_plan({"base": t}, demands, None, PlanParams(), 0.0)
    t.remove("http://r3")
    second = make_plan({"base": t}, demands, first, PlanParams(), 3.0)
    moved = {n for n in first.targets if first.targets[n] != second.targets.get(n)}
    assert moved and all("http://r3" in first.targets[n] for n in moved)
    assert all("http://r3" not in urls for urls in second.targets.values())


def test_holders_and_previous_targets_are_kept_over_a_better_ring_position() -> None:
    t = table(6)
    order = list(t.walk("x"))
    holder = order[-1]  # the worst ring position
    t.put(view(holder, res("x"), max_adapters=8, max_loras=4))
    plan = make_plan({"base": t}, [demand("x", 1.0)], None, PlanParams(), 0.0)
    assert plan.targets["x"] == frozenset({holder})  # no load beats a better position


def test_fewer_copies_only_after_scale_down_ticks_plans_in_a_row() -> None:
    t = table(4)
    params = PlanParams(copy_share=0.25, scale_down_ticks=3)
    plan = make_plan({"base": t}, [demand("a", 5.0, inflight=70)], None, params, 0.0)
    assert len(plan.targets["a"]) == 3
    sizes = []
    for tick in range(1, 6):
        plan = make_plan({"base": t}, [demand("a", 0.5, inflight=1)], plan, params, float(tick))
        sizes.append(len(plan.targets["a"]))
    assert sizes == [3, 3, 1, 1, 1]
    more = make_plan({"base": t}, [demand("a", 5.0, inflight=70)], plan, params, 9.0)
    assert len(more.targets["a"]) == 3  # up at once


def test_desired_replicas_track_demand_and_queueing() -> None:
    t = table(2, max_loras=4)
    params = PlanParams(target_util=0.5)
    low = make_plan({"base": t}, [demand("a", 1.0, inflight=2)], None, params, 0.0)
    high = make_plan(
        {"base": t}, [demand(f"a{i}", 2.0, inflight=20) for i in range(30)], None, params, 0.0
    )  # 600 concurrent over max_num_seqs 100 × 0.5, 30 running adapters over 4 × 0.5
    assert low.desired == {"p": 1}
    assert high.desired == {"p": 15}
    queued = ReplicaTable()
    queued.put(view("http://q0", waiting=5))
    queued.put(view("http://q1"))
    assert make_plan({"base": queued}, [demand("a", 0.1)], None, params, 0.0).desired == {"p": 3}


def test_cold_adapters_keep_out_of_the_gpu_slots_reserved_for_hot_ones() -> None:
    t = ReplicaTable()
    for i in range(2):
        t.put(
            ReplicaView(
                url=f"http://r{i}", pool="p", healthy=True, max_loras=2, max_adapters=8, reserved_hot_slots=1
            )
        )
    busy = [demand(f"c{i}", 3.0, inflight=3) for i in range(4)]  # each almost always running
    plan = make_plan({"base": t}, busy, None, PlanParams(), 0.0)
    per: dict[str, int] = {}
    for urls in plan.targets.values():
        for u in urls:
            per[u] = per.get(u, 0) + 1
    assert max(per.values()) <= 1  # one cold adapter running per replica: the other slot is hot's
    assert plan.overflow == 2


def test_actions_load_what_is_missing_and_unload_only_moved_idle_copies() -> None:
    t = table(3, r0=["a"], r1=["b"])
    plan = Plan(targets={"a": frozenset({"http://r0", "http://r1"}), "b": frozenset({"http://r2"})})
    acts = actions(plan, {"base": t})
    assert [(a.kind, a.url, a.lora_name) for a in acts] == [
        ("load", "http://r1", "a"),
        ("load", "http://r2", "b"),
    ]
    previous = Plan(targets={"b": frozenset({"http://r1"})})
    assert [a.kind for a in actions(plan, {"base": t}, previous)] == ["load", "load"]  # b not on r2 yet
    t.put(view("http://r2", res("b"), max_adapters=8, max_loras=4))
    moved = actions(plan, {"base": t}, previous)
    assert ("unload", "http://r1", "b") in [(a.kind, a.url, a.lora_name) for a in moved]
    t.put(view("http://r1", res("b", inflight=2), max_adapters=8, max_loras=4))
    assert "unload" not in [a.kind for a in actions(plan, {"base": t}, previous)]  # in use: kept
    fewer = Plan(targets={"b": frozenset({"http://r2"})})
    two = Plan(targets={"b": frozenset({"http://r1", "http://r2"})})
    assert "unload" not in [a.kind for a in actions(fewer, {"base": t}, two)]  # fewer copies: kept


def test_plans_round_trip_as_json() -> None:
    t = table(3)
    plan = make_plan({"base": t}, [demand("a", 2.0, inflight=1), demand("b", 1.0)], None, PlanParams(), 12.5)
    again = Plan.from_json(plan.to_json())
    assert again == plan
    with pytest.raises((KeyError, TypeError, ValueError, AssertionError)):
        Plan.from_json({"targets": 3})


def test_forecast_rises_fast_falls_slowly_and_forgets() -> None:
    f = Forecaster(alpha_up=0.7, alpha_down=0.2, floor=0.01)
    assert f.observe({"a": 30}, 3.0) == {"a": 10.0}
    up = f.observe({"a": 60}, 3.0)["a"]
    assert up == pytest.approx(0.7 * 20 + 0.3 * 10)
    down = f.observe({}, 3.0)["a"]
    assert down == pytest.approx(0.8 * up)
    for _ in range(40):
        f.observe({}, 3.0)
    assert "a" not in f.rates
    assert f.observe({"b": 3}, 0.0) == f.rates  # no time passed: nothing folded in
    with pytest.raises(ValueError):
        Forecaster(alpha_up=0.0)
