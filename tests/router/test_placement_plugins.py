"""Placement plugins: score tables of every filter, scorer and picker on crafted snapshots."""

from __future__ import annotations

import pytest

from router.placement.filters import CanHostFilter, ExcludeFilter, HealthyFilter
from router.placement.framework import PickContext, summary
from router.placement.pickers import (
    MaxScorePicker,
    MaxScoreRandomTiePicker,
    RandomPicker,
    RoundRobinPicker,
    WeightedRandomPicker,
)
from router.placement.scorers import (
    FreeSlotScorer,
    GieLoraAffinityScorer,
    KvCacheScorer,
    LeastRequestScorer,
    LoadScorer,
    QueueScorer,
    RunningSetScorer,
)
from router.placement.types import PlacementRequest
from tests.router.test_placement_support import req, res, view


def ctx(name: str | None, *views, now: float = 100.0, exclude=()) -> PickContext:
    return PickContext(req(name, exclude), list(views), now)


# ---------------------------------------------------------------- filters


def kept(f, c: PickContext) -> list[int]:
    """Indices a filter keeps (None means all of them)."""
    keep = f.keep(c)
    return list(range(len(c.replicas))) if keep is None else keep


def test_healthy_filter_drops_out_of_rotation() -> None:
    c = ctx("a", view("r0", healthy=False), view("r1"), view("r2", healthy=False))
    assert kept(HealthyFilter(), c) == [1]
    assert HealthyFilter().keep(ctx("a", view("r0"))) is None  # nothing to drop


def test_exclude_filter_drops_listed_urls() -> None:
    c = ctx("a", view("r0"), view("r1"), view("r2"), exclude=("r0", "r2"))
    assert kept(ExcludeFilter(), c) == [1]


def test_can_host_filter_table() -> None:
    full_busy = view("busy", res("x", inflight=1), res("y", inflight=2), max_adapters=2)
    full_loading = view("loading", res("x", state="loading"), res("y", inflight=1), max_adapters=2)
    full_idle = view("idle", res("x"), res("y", inflight=1), max_adapters=2)
    free = view("free", res("x", inflight=1), max_adapters=2)
    holder = view("holder", res("a", inflight=1), res("y", inflight=1), max_adapters=2)
    failed_only = view("failed", res("x", state="failed"), res("y", inflight=1), max_adapters=2)
    c = ctx("a", full_busy, full_loading, full_idle, free, holder, failed_only)
    assert kept(CanHostFilter(), c) == [2, 3, 4, 5]
    # Base-model requests never need a registration slot.
    assert kept(CanHostFilter(), ctx(None, full_busy, full_loading)) == [0, 1]


def test_summary_counts_occupancy_running_and_lru_order() -> None:
    v = view(
        "r",
        res("old", last_used=1.0),
        res("new", last_used=9.0),
        res("mid", last_used=5.0),
        res("busy", last_used=0.5, inflight=3),
        res("gone", state="failed"),
        res("coming", state="loading"),
        max_adapters=8,
    )
    s = summary(v)
    assert s.occupied == 5  # failed holds no slot
    assert s.running == 1
    assert [r.lora_name for r in s.idle_lru] == ["old", "mid", "new"]  # busy/loading never idle
    assert summary(v) is s  # memoised on the snapshot


# ---------------------------------------------------------------- scorers


def test_load_scorer_table() -> None:
    c = ctx(
        "a",
        view("r0", inflight=0),
        view("r1", inflight=25, waiting=25),
        view("r2", inflight=150),
    )
    assert LoadScorer().score(c) == pytest.approx([1.0, 0.5, 0.0])


def test_least_request_and_queue_scorers_are_min_max_normalised() -> None:
    c = ctx("a", view("r0", inflight=2, waiting=4), view("r1", inflight=6, waiting=0), view("r2", inflight=4))
    assert LeastRequestScorer().score(c) == pytest.approx([1.0, 0.0, 0.5])
    assert QueueScorer().score(c) == pytest.approx([0.0, 1.0, 1.0])
    same = ctx("a", view("r0", inflight=3), view("r1", inflight=3))
    assert LeastRequestScorer().score(same) == [1.0, 1.0]


def test_kv_cache_scorer_table() -> None:
    c = ctx("a", view("r0", kv=0.0), view("r1", kv=0.25), view("r2", kv=1.0))
    assert KvCacheScorer().score(c) == pytest.approx([1.0, 0.75, 0.0])


def test_gie_lora_affinity_table() -> None:
    running = view("running", lora_running=("a", "b"), lora_waiting=("a", "b"), max_loras=2)
    room = view("room", lora_running=("b",), lora_waiting=("b",), max_loras=2)
    waiting_only = view("waiting", lora_running=("b", "c"), lora_waiting=("a",), max_loras=2)
    full = view("full", lora_running=("b", "c"), lora_waiting=("b", "c"), max_loras=2)
    # Resident but idle: GIE cannot see it (lora_requests_info lists in-flight adapters only).
    idle_resident = view("idle", res("a"), lora_running=("b", "c"), max_loras=2)
    c = ctx("a", running, room, waiting_only, full, idle_resident)
    assert GieLoraAffinityScorer().score(c) == [1.0, 0.8, 0.6, 0.0, 0.0]
    # GIE's Go code adds both list lengths: with vLLM >= 0.11.1 (same set in both) "room" is full.
    assert GieLoraAffinityScorer(count="sum").score(c) == [1.0, 0.0, 0.6, 0.0, 0.0]
    assert GieLoraAffinityScorer().score(ctx(None, full)) == [1.0]


def test_running_set_scorer_table() -> None:
    a_running = view("a-running", res("a", inflight=1), res("b", inflight=1), max_loras=2)
    empty = view("empty", max_loras=2)
    one = view("one", res("b", inflight=1), max_loras=2)
    full = view("full", res("a"), res("b", inflight=1), res("c", inflight=1), max_loras=2)
    over = view("over", res("b", inflight=1), res("c", inflight=1), res("d", inflight=2), max_loras=2)
    c = ctx("a", a_running, empty, one, full, over)
    # Full: 0.4 / (1 + k - max_loras) — the fewer adapters already queued ahead, the better.
    assert RunningSetScorer().score(c) == pytest.approx([1.0, 0.9, 0.8, 0.4, 0.2])
    assert RunningSetScorer().score(ctx(None, full)) == [1.0]


def test_free_slot_scorer_table() -> None:
    holder = view("holder", res("a"), res("b"), max_adapters=2)
    free = view("free", res("b"), max_adapters=2)
    stale = view("stale", res("b", last_used=0.0), res("c", inflight=1), max_adapters=2)
    fresh = view("fresh", res("b", last_used=100.0), res("c", inflight=1), max_adapters=2)
    half = view("half", res("b", last_used=70.0), res("c", last_used=90.0), max_adapters=2)
    busy = view("busy", res("b", inflight=1), res("c", inflight=1), max_adapters=2)
    c = ctx("a", holder, free, stale, fresh, half, busy, now=100.0)
    assert FreeSlotScorer(idle_horizon_s=60.0).score(c) == pytest.approx([1.0, 1.0, 0.6, 0.1, 0.35, 0.0])


def test_prefix_cache_scorer_is_the_cached_share_of_the_prompt_for_this_adapter() -> None:
    from router.placement.scorers import PrefixCacheScorer

    views = [view("r0"), view("r1"), view("r2")]
    request = PlacementRequest(lora_name="a", adapter_id="a", prompt_tokens=100, prefix={"r0": 80, "r1": 150})
    assert PrefixCacheScorer().score(PickContext(request, views, 0.0)) == [0.8, 1.0, 0.0]
    no_prompt = PlacementRequest(lora_name="a", adapter_id="a", prefix={"r0": 80})
    assert PrefixCacheScorer().score(PickContext(no_prompt, views, 0.0)) == [0.0, 0.0, 0.0]


# ---------------------------------------------------------------- pickers


def test_max_score_picker_breaks_ties_by_snapshot_order() -> None:
    c = ctx("a", view("r0"), view("r1"), view("r2"))
    assert MaxScorePicker().pick(c, [0.5, 0.9, 0.9]) == 1
    assert MaxScorePicker().pick(c, [0.2, 0.1, 0.3]) == 2


def test_random_pickers_are_deterministic_with_a_seed() -> None:
    c = ctx("a", *(view(f"r{i}") for i in range(5)))
    totals = [1.0, 1.0, 1.0, 0.0, 1.0]
    for cls in (MaxScoreRandomTiePicker, WeightedRandomPicker, RandomPicker):
        a, b = cls(seed=7), cls(seed=7)
        seq_a = [a.pick(c, totals) for _ in range(50)]
        assert seq_a == [b.pick(c, totals) for _ in range(50)]
        assert len(set(seq_a)) > 1  # actually random
    tie = MaxScoreRandomTiePicker(seed=1)
    assert {tie.pick(c, totals) for _ in range(100)} == {0, 1, 2, 4}
    weighted = WeightedRandomPicker(seed=1)
    assert 3 not in {weighted.pick(c, totals) for _ in range(200)}  # zero weight never picked


def test_round_robin_picker_cycles() -> None:
    c = ctx("a", view("r0"), view("r1"), view("r2"))
    rr = RoundRobinPicker()
    assert [rr.pick(c, [0.0, 0.0, 0.0]) for _ in range(7)] == [0, 1, 2, 0, 1, 2, 0]
