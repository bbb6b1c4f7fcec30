"""Evictors: the rules every evictor applies (only idle residents, kept hot and planned copies)
and each one's order; through every profile."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from router.placement import SchedulerProfile, make_profile, profile_from_config
from router.placement.evictors import (
    EVICTORS,
    CostAwareEvictor,
    HotCopyEvictor,
    LruIdleEvictor,
    final_victims,
    kept,
)
from router.placement.framework import Chosen, Evictor, PickContext
from router.placement.types import Decision, PlacementRequest, ReplicaView, Residency
from tests.router.test_placement_support import res, view

ALL_EVICTORS: tuple[Evictor, ...] = (LruIdleEvictor(), HotCopyEvictor(), CostAwareEvictor())


def outcome(d: Decision) -> tuple[object, ...]:
    return (d.replica, d.action, d.evict, d.reason, dict(d.scores))


def hot_req(name: str, targets: dict[str, int], strict: bool = False) -> PlacementRequest:
    return PlacementRequest(lora_name=name, adapter_id=name, hot_targets=targets, strict_hot=strict)


def victims(
    ev: Evictor, request: PlacementRequest, replicas: list[ReplicaView], need: int, now: float = 100.0
) -> tuple[str, ...] | None:
    return ev.victims(Chosen(PickContext(request, replicas, now), 0), need)


@pytest.mark.parametrize("ev", ALL_EVICTORS, ids=lambda e: e.name)
def test_only_idle_resident_adapters_are_ever_victims(ev: Evictor) -> None:
    r0 = view(
        "r0",
        res("busy", last_used=1.0, inflight=1),
        res("loading", last_used=1.0, state="loading"),
        res("staging", last_used=1.0, state="staging"),
        res("unloading", last_used=1.0, state="unloading"),
        res("failed", last_used=1.0, state="failed"),
        res("idle", last_used=50.0),
        max_adapters=5,
    )
    assert victims(ev, hot_req("a", {}), [r0], 1) == ("idle",)
    assert victims(ev, hot_req("a", {}), [r0], 2) is None  # one candidate: no room for two


@pytest.mark.parametrize("ev", ALL_EVICTORS, ids=lambda e: e.name)
def test_a_hot_copy_is_passed_over_while_another_idle_victim_exists(ev: Evictor) -> None:
    # "hot" wants 2 copies and has exactly 2: evicting the one on r0 would leave 1.
    r0 = view("r0", res("hot", last_used=1.0), res("cold", last_used=90.0), max_adapters=2)
    r1 = view("r1", res("hot", last_used=1.0))
    assert victims(ev, hot_req("a", {"hot": 2}), [r0, r1], 1) == ("cold",)
    # Without a target (or with a target already exceeded) the order is the evictor's own.
    assert victims(ev, hot_req("a", {}), [r0, r1], 1) == ("hot",)
    r2 = view("r2", res("hot", last_used=1.0))
    assert victims(ev, hot_req("a", {"hot": 2}), [r0, r1, r2], 1) == ("hot",)


def test_hot_copies_are_counted_on_healthy_replicas_in_a_state_other_than_failed() -> None:
    r0 = view("r0", res("hot", last_used=1.0), res("cold", last_used=90.0), max_adapters=2)
    failed = view("r1", res("hot", state="failed"))
    sick = view("r2", res("hot"), healthy=False)
    loading = view("r3", res("hot", state="loading"))
    request = hot_req("a", {"hot": 1})  # r0's copy is the only one that counts
    assert kept(Chosen(PickContext(request, [r0, failed, sick], 0.0), 0), "hot")
    assert not kept(Chosen(PickContext(request, [r0, failed, sick, loading], 0.0), 0), "hot")
    assert not kept(Chosen(PickContext(request, [r0], 0.0), 0), "cold")  # no target
    assert not kept(Chosen(PickContext(hot_req("a", {"hot": 0}), [r0], 0.0), 0), "hot")
    assert victims(LruIdleEvictor(), request, [r0, failed, sick], 1) == ("cold",)
    assert victims(LruIdleEvictor(), request, [r0, failed, sick, loading], 1) == ("hot",)


@pytest.mark.parametrize("ev", ALL_EVICTORS, ids=lambda e: e.name)
def test_only_hot_copies_left_strict_gets_no_room_otherwise_the_request_wins(ev: Evictor) -> None:
    r0 = view("r0", res("hot", last_used=1.0), res("busy", inflight=3), max_adapters=2)
    assert victims(ev, hot_req("a", {"hot": 1}, strict=True), [r0], 1) is None
    assert victims(ev, hot_req("a", {"hot": 1}), [r0], 1) == ("hot",)


@pytest.mark.parametrize("ev", ALL_EVICTORS, ids=lambda e: e.name)
def test_several_victims_take_the_unprotected_first_then_hot_copies(ev: Evictor) -> None:
    r0 = view(
        "r0",
        res("h1", last_used=1.0),
        res("h2", last_used=2.0),
        res("c1", last_used=80.0),
        max_adapters=1,
    )
    targets = {"h1": 1, "h2": 1}
    got = victims(ev, hot_req("a", targets), [r0], 3)
    assert got is not None and got[0] == "c1" and set(got) == {"h1", "h2", "c1"}
    assert victims(ev, hot_req("a", targets), [r0], 2) in (("c1", "h1"), ("c1", "h2"))
    assert victims(ev, hot_req("a", targets, strict=True), [r0], 2) is None
    assert victims(ev, hot_req("a", targets, strict=True), [r0], 1) == ("c1",)


def test_final_victims_keeps_the_given_order() -> None:
    ctx = PickContext(hot_req("a", {"x": 1}), [view("r0", res("x"), res("y"), res("z"))], 0.0)
    assert final_victims(Chosen(ctx, 0), ["z", "x", "y"], 2) == ("z", "y")
    plain = PickContext(hot_req("a", {}), ctx.all_replicas, 0.0)
    assert final_victims(Chosen(plain, 0), ["z", "x", "y"], 2) == ("z", "x")


def test_keep_hot_evictor_passes_over_copies_in_demand_elsewhere() -> None:
    # "busy-elsewhere" is idle on r0 but has 20 of 100 seqs in flight on r1 (≥ low_water 5 %).
    r0 = view(
        "r0",
        res("busy-elsewhere", last_used=1.0),
        res("quiet", last_used=50.0),
        max_adapters=2,
        max_num_seqs=100,
    )
    r1 = view("r1", res("busy-elsewhere", inflight=20), max_num_seqs=100)
    for ev in (HotCopyEvictor(), CostAwareEvictor()):
        assert victims(ev, hot_req("a", {}), [r0, r1], 1) == ("quiet",)
        assert victims(ev, hot_req("a", {}), [r0, r1], 2) == ("quiet", "busy-elsewhere")
    assert victims(LruIdleEvictor(), hot_req("a", {}), [r0, r1], 1) == ("busy-elsewhere",)


def freq(name: str, last_used: float, requests: int, size_bytes: int = 0) -> Residency:
    return Residency(
        lora_name=name,
        state="resident",
        adapter_id=name,
        last_used=last_used,
        size_bytes=size_bytes,
        requests=requests,
    )


def test_cost_aware_weighs_frequency_against_recency() -> None:
    ev = CostAwareEvictor(half_life_s=60.0)
    # Asked 40 times, last a minute ago (value 20) vs. once, just now (value 1): keep the popular one.
    r0 = view("r0", freq("popular", 40.0, 40), freq("one-off", 100.0, 1), max_adapters=2)
    assert victims(ev, hot_req("a", {}), [r0], 1) == ("one-off",)
    assert victims(LruIdleEvictor(), hot_req("a", {}), [r0], 1) == ("popular",)
    # Popular long ago: 40 requests, 10 half-lives idle (value 0.04) loses to one recent request.
    r0 = view("r0", freq("was-popular", -500.0, 40), freq("one-off", 100.0, 1), max_adapters=2)
    assert victims(ev, hot_req("a", {}), [r0], 1) == ("was-popular",)


def test_cost_aware_keeps_the_adapter_that_is_slower_to_reload() -> None:
    ev = CostAwareEvictor(load_fixed_s=0.1, load_bytes_per_s=1e9)
    big = freq("big", 90.0, 5, size_bytes=2_000_000_000)  # 2.1 s to reload
    small = freq("small", 95.0, 5, size_bytes=10_000_000)  # 0.11 s to reload
    r0 = view("r0", big, small, max_adapters=2)
    assert victims(ev, hot_req("a", {}), [r0], 1) == ("small",)
    assert ev.value(big, 100.0) > ev.value(small, 100.0)


def test_cost_aware_value_is_finite_and_ordered_on_odd_clocks() -> None:
    ev = CostAwareEvictor()
    now = 100.0
    future = freq("future", 1e9, 3)  # another process's clock ahead of ours: counts as just used
    assert ev.value(future, now) == ev.value(freq("x", now, 3), now)
    assert ev.value(freq("nan", math.nan, 3), now) == 0.0
    assert ev.value(freq("old", -math.inf, 3), now) == 0.0
    assert ev.value(freq("unknown", now, 0), now) == ev.value(freq("once", now, 1), now)
    r0 = view("r0", freq("nan", math.nan, 9), freq("recent", 99.0, 1), freq("future", 1e9, 1), max_adapters=3)
    assert victims(ev, hot_req("a", {}), [r0], 1) == ("nan",)
    for now in (math.nan, math.inf, -math.inf):  # ties everywhere: LRU order decides
        got = victims(ev, hot_req("a", {}), [r0], 3, now)
        assert got is not None and sorted(got) == ["future", "nan", "recent"]
    bad: dict[str, float]
    for bad in (
        {"half_life_s": 0.0},
        {"half_life_s": math.inf},
        {"load_fixed_s": -1.0},
        {"load_bytes_per_s": 0.0},
    ):
        with pytest.raises(ValueError):
            CostAwareEvictor(**bad)  # type: ignore[arg-type]


# ---------------------------------------------------------------- through the profiles


def test_every_profile_keeps_hot_copies_and_says_so_when_strict() -> None:
    r0 = view("r0", res("hot", last_used=1.0), res("cold", last_used=90.0), max_adapters=2, max_loras=4)
    r1 = view("r1", res("hot", last_used=1.0), res("hot2", last_used=1.0), max_adapters=2, max_loras=4)
    for name in ("default", "round-robin", "least-request", "random", "gie-lora-affinity", "llm-d", "custom"):
        p = make_profile(name)
        d = p.pick(hot_req("a", {"hot": 2}), [replace(r0)], 100.0)
        assert (d.replica, d.evict) == ("r0", ("cold",)), name
        # Only hot copies idle: a hot prewarm gets no room, a live request takes one.
        only_hot = [replace(r1), replace(r0, residents={"hot": r0.residents["hot"]}, max_adapters=1)]
        d = p.pick(hot_req("a", {"hot": 2, "hot2": 1}, strict=True), only_hot, 100.0)
        assert d.replica is None and d.action == "none", name
        d = p.pick(hot_req("a", {"hot": 2, "hot2": 1}), [replace(v) for v in only_hot], 100.0)
        assert d.replica is not None and d.action == "load" and len(d.evict) == 1, name


def test_custom_profile_takes_any_registered_evictor() -> None:
    assert set(EVICTORS) == {"lru-idle", "lru-idle-keep-hot", "cost-aware-keep-hot"}
    p = profile_from_config("custom", '{"evictor": ["cost-aware-keep-hot", {"half_life_s": 30}]}')
    assert isinstance(p, SchedulerProfile)
    assert isinstance(p.evictor, CostAwareEvictor) and p.evictor.half_life_s == 30
    assert p.describe()["evictor"] == "cost-aware-keep-hot"
    plain = make_profile("custom")
    assert isinstance(plain, SchedulerProfile) and isinstance(plain.evictor, LruIdleEvictor)
    with pytest.raises(ValueError, match="unknown evictor"):
        profile_from_config("custom", '{"evictor": "fifo"}')
    with pytest.raises(ValueError, match="bad parameters for evictor"):
        profile_from_config("custom", '{"evictor": ["lru-idle", {"scan": 3}]}')


def plan_req(name: str, plan: dict[str, set[str]], strict: bool = False) -> PlacementRequest:
    return PlacementRequest(
        lora_name=name, adapter_id=name, plan={k: frozenset(v) for k, v in plan.items()}, strict_hot=strict
    )


@pytest.mark.parametrize("ev", ALL_EVICTORS, ids=lambda e: e.name)
def test_a_copy_planned_on_its_replica_is_passed_over_and_strict_loads_never_take_it(ev: Evictor) -> None:
    r0 = view("r0", res("planned", last_used=1.0), res("cold", last_used=90.0), max_adapters=2)
    assert victims(ev, plan_req("a", {"planned": {"r0"}}), [r0], 1) == ("cold",)
    # planned elsewhere only: an ordinary victim here
    assert victims(ev, plan_req("a", {"planned": {"r9"}}), [r0], 1) == ("planned",)
    only = view("r0", res("planned", last_used=1.0), res("busy", inflight=1), max_adapters=2)
    assert victims(ev, plan_req("a", {"planned": {"r0"}}, strict=True), [only], 1) is None
    assert victims(ev, plan_req("a", {"planned": {"r0"}}), [only], 1) == ("planned",)


def test_default_profile_takes_another_evictor() -> None:
    p = profile_from_config(
        "default", '{"evictor": ["cost-aware-keep-hot", {"low_water": 0.1, "half_life_s": 9}]}'
    )
    ev = p.evictor  # type: ignore[attr-defined]
    assert isinstance(ev, CostAwareEvictor) and (ev.low_water, ev.half_life_s) == (0.1, 9)
    assert type(make_profile("default", evictor="lru-idle").evictor) is LruIdleEvictor  # type: ignore[attr-defined]
    assert type(make_profile("default").evictor) is CostAwareEvictor  # type: ignore[attr-defined]
    with pytest.raises(ValueError, match="unknown evictor"):
        make_profile("default", evictor="lfu")
