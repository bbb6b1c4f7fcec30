"""The default policy (``router/placement/default.py``): decisions on crafted snapshots, the cost
model's table (tiers, deferral, load, prefix, plan, rank), and what a decision visits."""

from __future__ import annotations

import pytest

from router.placement import make_profile
from router.placement.costs import CostModel
from router.placement.default import DefaultPolicy
from router.placement.table import ReplicaTable
from router.placement.tiers import tier_of
from router.placement.types import PlacementRequest, ReplicaView
from tests.router.test_placement_support import req, res, view


def policy(**params: object) -> DefaultPolicy:
    p = make_profile("default", **params)
    assert isinstance(p, DefaultPolicy)
    return p


def test_hits_the_resident_replica() -> None:
    replicas = [view("r0", res("b", inflight=1)), view("r1", res("a", last_used=5.0)), view("r2")]
    d = policy().pick(req("a"), replicas, 10.0)
    assert (d.replica, d.action, d.evict, d.tier) == ("r1", "hit", (), "gpu")
    assert d.scores["r1"] == max(d.scores.values())


def test_joins_a_load_in_flight() -> None:
    d = policy().pick(req("a"), [view("r0"), view("r1", res("a", state="loading"))], 10.0)
    assert (d.replica, d.action, d.evict) == ("r1", "hit", ())


def test_loads_onto_a_free_slot_of_the_least_loaded_replica() -> None:
    full = view("full", res("x"), res("y"), max_adapters=2, inflight=0)
    busy = view("busy", res("z", inflight=40), max_adapters=2)
    calm = view("calm", res("w", inflight=5), max_adapters=2)
    d = policy().pick(req("a"), [full, busy, calm], 100.0)
    assert (d.replica, d.action, d.evict, d.tier) == ("calm", "load", (), "load")


def test_evicts_the_cheapest_idle_adapter_never_one_in_flight() -> None:
    r0 = view(
        "r0",
        res("old-busy", last_used=1.0, inflight=2),
        res("older-idle", last_used=2.0),
        res("newer-idle", last_used=8.0),
        res("loading", last_used=0.0, state="loading"),
        max_adapters=4,
        max_loras=4,
    )
    d = policy().pick(req("a"), [r0], 10.0)
    assert (d.replica, d.action, d.evict) == ("r0", "load", ("older-idle",))
    r1 = view(
        "r1", res("a1", last_used=3.0), res("a2", last_used=1.0), res("a3", last_used=2.0), max_adapters=2
    )
    assert policy().pick(req("new"), [r1], 10.0).evict == ("a2", "a3")  # as many as needed


def test_a_free_slot_beats_an_eviction_and_the_cheaper_eviction_wins() -> None:
    full_dear = view("dear", res("p", last_used=99.0), max_adapters=1)  # used a second ago
    full_cheap = view("cheap", res("q", last_used=-300.0), max_adapters=1)  # 400 s idle
    free = view("free", res("x", last_used=99.0), max_adapters=2, inflight=30)
    assert policy().pick(req("a"), [full_dear, full_cheap, free], 100.0).replica == "free"
    d = policy().pick(req("a"), [full_dear, full_cheap], 100.0)
    assert (d.replica, d.evict) == ("cheap", ("q",))


def test_replicates_rather_than_wait_behind_a_full_running_set() -> None:
    # r0 is lighter but already runs max_loras (2) distinct adapters: "a" would be deferred there.
    r0 = view("r0", res("x", inflight=1), res("y", inflight=1), max_loras=2, max_adapters=8)
    r1 = view("r1", res("z", inflight=10), max_loras=2, max_adapters=8)
    assert (policy().pick(req("a"), [r0, r1], 1.0).action, "r1") == ("load", "r1")
    assert policy().pick(req("a"), [r0, r1], 1.0).replica == "r1"
    r0b = view("r0", res("a"), res("x", inflight=1), res("y", inflight=1), max_loras=2, max_adapters=8)
    d = policy().pick(req("a"), [r0b, r1], 1.0)
    assert (d.replica, d.action) == ("r1", "replicate")
    # ... unless waiting costs less than a load: a copy is then not worth it
    d = policy(defer_s=0.01).pick(req("a"), [r0b, r1], 1.0)
    assert (d.replica, d.action) == ("r0", "hit")


def test_a_hot_adapter_gets_one_copy_when_its_replica_saturates_and_no_flapping() -> None:
    cap = 100
    p = policy()
    hot0 = view("r0", res("hot", inflight=50), max_num_seqs=cap, max_loras=4, max_adapters=4)
    spare = view("r1", res("cold", last_used=-5000.0), max_num_seqs=cap, max_loras=4, max_adapters=4)
    assert p.pick(req("hot"), [hot0, spare], 10.0).replica == "r0"  # half full: stay
    jammed = view("r0", res("hot", inflight=95), max_num_seqs=cap, max_loras=4, max_adapters=4)
    d = p.pick(req("hot"), [jammed, spare], 10.0)
    assert (d.replica, d.action) == ("r1", "replicate")
    # with both copies, requests go to the lighter one and never load again
    copy = view("r1", res("hot", inflight=1), res("cold", last_used=-5000.0), max_num_seqs=cap, max_loras=4)
    for inflight in (95, 60, 96, 10):
        r0 = view("r0", res("hot", inflight=inflight), max_num_seqs=cap, max_loras=4, max_adapters=4)
        assert p.pick(req("hot"), [r0, copy], 10.0).action == "hit"


def test_base_requests_go_to_the_least_loaded_replica() -> None:
    replicas = [
        view("r0", res("x", inflight=3), max_loras=1),
        view("r1", inflight=1, waiting=0),
        view("r2", inflight=0, waiting=2),
    ]
    d = policy().pick(req(None), replicas, 1.0)
    assert (d.replica, d.action, d.evict, d.tier) == ("r1", "hit", (), "")


def test_honours_exclude_and_health() -> None:
    replicas = [view("r0", res("a")), view("r1", healthy=False), view("r2")]
    d = policy().pick(req("a", exclude=("r0",)), replicas, 1.0)
    assert (d.replica, d.action) == ("r2", "replicate")
    d = policy().pick(req("a", exclude=("r0", "r2")), replicas, 1.0)
    assert (d.replica, d.action) == (None, "none")
    assert policy().pick(req("a"), [], 1.0).replica is None


# ---------------------------------------------------------------- tiers


def test_tiers_follow_recency_over_gpu_slots_then_the_cpu_cache() -> None:
    v = ReplicaView(
        url="r",
        pool="p",
        healthy=True,
        max_loras=2,
        max_adapters=6,
        max_cpu_loras=4,
        residents={
            r.lora_name: r
            for r in (
                res("running", inflight=1, last_used=0.0),
                res("newest", last_used=9.0),
                res("next", last_used=8.0),
                res("older", last_used=7.0),
                res("oldest", last_used=1.0),
                res("loading", state="loading"),
            )
        },
    )
    got = {n: tier_of(v, n) for n in ("running", "newest", "next", "older", "oldest", "loading", "absent")}
    assert got == {
        "running": "gpu",  # in flight: in a slot
        "newest": "gpu",  # the other GPU slot
        "next": "cpu",  # host cache: max_cpu_loras 4 = 2 GPU + 2 more
        "older": "cpu",
        "oldest": "disk",  # registered, re-read from disk
        "loading": "gpu",
        "absent": "load",
    }
    assert tier_of(v, None) == ""


def test_the_cpu_tier_is_priced_between_a_gpu_hit_and_a_load() -> None:
    m = CostModel()
    busy = {r.lora_name: r for r in (res("a", last_used=1.0), res("b", inflight=1), res("c", inflight=1))}
    cached = ReplicaView(
        url="r", pool="p", healthy=True, max_loras=2, max_adapters=4, max_cpu_loras=4, residents=busy
    )
    assert m.tier_cost(cached, busy["a"]) == pytest.approx(m.cpu_s)  # a size-0 adapter: the fixed part
    # vLLM's default host cache (max_cpu_loras = max_loras) holds only the running ones: disk
    default = ReplicaView(url="r", pool="p", healthy=True, max_loras=2, max_adapters=4, residents=busy)
    assert m.tier_cost(default, busy["a"]) == pytest.approx(m.disk_s)
    assert 0 < m.cpu_s < m.disk_s < m.load_s


def test_a_cpu_tier_holder_wins_over_a_load_and_a_gpu_holder_over_both() -> None:
    cpu = ReplicaView(
        url="cpu", pool="p", healthy=True, max_loras=1, max_adapters=4, max_cpu_loras=4,
        residents={"a": res("a", last_used=1.0), "b": res("b", last_used=5.0)},
    )  # fmt: skip
    empty = view("empty", max_loras=1, max_adapters=4)
    d = policy().pick(req("a"), [empty, cpu], 10.0)
    assert (d.replica, d.tier) == ("cpu", "cpu")
    gpu = view("gpu", res("a", last_used=9.0), max_loras=1, max_adapters=4)
    assert policy().pick(req("a"), [empty, cpu, gpu], 10.0).replica == "gpu"


# ---------------------------------------------------------------- prefix, plan, rank


def test_prefers_the_holder_with_the_longest_cached_prefix_while_the_load_allows() -> None:
    r0 = view("r0", res("a", inflight=2), max_num_seqs=100)
    r1 = view("r1", res("a", inflight=3), max_num_seqs=100)
    plain = PlacementRequest(lora_name="a", adapter_id="a", prompt_tokens=2000)
    assert policy().pick(plain, [r0, r1], 1.0).replica == "r0"
    cached = PlacementRequest(lora_name="a", adapter_id="a", prompt_tokens=2000, prefix={"r1": 1500})
    assert policy().pick(cached, [r0, r1], 1.0).replica == "r1"
    # r1 nearly saturated: the saved prefill (0.15 s) no longer pays for its queue
    hot = view("r1", res("a", inflight=94), max_num_seqs=100)
    assert policy().pick(cached, [r0, hot], 1.0).replica == "r0"
    # a prefix cached where the adapter is gone is worth nothing (vLLM keys blocks by lora_name)
    gone = view("r1")
    assert policy().pick(cached, [r0, gone], 1.0).replica == "r0"


def test_prefers_the_planned_replicas_and_loads_onto_them() -> None:
    r0 = view("r0", res("a"), max_num_seqs=100)
    r1 = view("r1", res("a"), max_num_seqs=100)
    planned = PlacementRequest(lora_name="a", adapter_id="a", plan={"a": frozenset({"r1"})})
    assert policy().pick(planned, [r0, r1], 1.0).replica == "r1"
    empty = [view("r0"), view("r1"), view("r2"), view("r3")]
    for target in ("r0", "r2", "r3"):
        d = policy().pick(
            PlacementRequest(lora_name="b", adapter_id="b", plan={"b": frozenset({target})}), empty, 1.0
        )
        assert (d.replica, d.action) == (target, "load")


def test_never_places_an_adapter_above_the_pools_max_lora_rank_and_prefers_less_padding() -> None:
    def ranked(url: str, max_rank: int) -> ReplicaView:
        return ReplicaView(
            url=url, pool="p", healthy=True, max_loras=2, max_adapters=4, max_lora_rank=max_rank
        )

    small, big = ranked("small", 16), ranked("big", 64)
    r64 = PlacementRequest(lora_name="a", adapter_id="a", rank=64)
    assert policy().pick(r64, [small, big], 1.0).replica == "big"
    assert policy().pick(r64, [small], 1.0).replica is None
    r8 = PlacementRequest(lora_name="b", adapter_id="b", rank=8)
    assert policy().pick(r8, [big, small], 1.0).replica == "small"


# ---------------------------------------------------------------- what a decision visits


def cluster(n: int, per: int = 4) -> list[ReplicaView]:
    return [
        view(f"http://r{i}", *(res(f"x{i}-{k}", last_used=float(k)) for k in range(per)), max_adapters=per)
        for i in range(n)
    ]


def test_a_decision_prices_a_handful_of_replicas_whatever_the_cluster_size() -> None:
    p = policy(choices=4, holders=8)
    big = cluster(1000)
    for k in range(50):
        d = p.pick(req(f"new-{k}"), big, 100.0)
        assert d.replica is not None and d.action == "load"
        assert len(d.scores) <= 4 + 8 + 16
    # a small cluster: every replica is a candidate, so the choice is the global cheapest
    small = cluster(4)
    small[2] = view("http://r2", res("z", last_used=-1e6), max_adapters=4)  # a free slot
    assert p.pick(req("anything"), small, 100.0).replica == "http://r2"


def test_adapters_keep_their_first_choice_when_a_replica_joins() -> None:
    t = ReplicaTable()
    for v in cluster(20, per=0):
        t.put(v)
    names = [f"lora-{i}" for i in range(400)]
    before = {n: next(iter(t.walk(n))) for n in names}
    t.put(view("http://r-new"))
    after = {n: next(iter(t.walk(n))) for n in names}
    moved = [n for n in names if before[n] != after[n]]
    assert all(after[n] == "http://r-new" for n in moved)  # only towards the newcomer
    assert 0 < len(moved) < 400 * 3 / 21  # about 1/21 of them
    t.remove("http://r-new")
    assert {n: next(iter(t.walk(n))) for n in names} == before


def test_the_table_indexes_holders_and_healthy_replicas() -> None:
    t = ReplicaTable()
    t.sync([view("r0", res("a")), view("r1", res("a"), res("b")), view("r2", healthy=False)])
    assert list(t.holders["a"]) == ["r0", "r1"] and list(t.holders["b"]) == ["r1"]
    assert t.healthy() == 2 and set(t.walk("x")) == {"r0", "r1"}
    t.sync([view("r0"), view("r1", res("b")), view("r2")])
    assert "a" not in t.holders and t.healthy() == 3
    t.sync([view("r1", res("b"))])
    assert set(t.views) == {"r1"} and list(t.walk("x")) == ["r1"]
