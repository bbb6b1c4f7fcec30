"""Placement profiles: the default policy's decisions, the baselines, config and determinism."""

from __future__ import annotations

import pytest

from router.placement import BASELINES, PROFILES, make_profile, profile_from_config
from router.placement.types import Profile, ReplicaView
from tests.router.test_placement_support import req, res, view

ALL = ("default", *BASELINES)


def test_registry_lists_default_and_baselines() -> None:
    assert set(ALL) <= set(PROFILES)
    for name in ALL:
        p: Profile = make_profile(name)
        assert p.name == name


# ---------------------------------------------------------------- default profile


def test_default_hits_resident_replica() -> None:
    replicas = [view("r0", res("b", inflight=1)), view("r1", res("a", last_used=5.0)), view("r2")]
    d = make_profile("default").pick(req("a"), replicas, 10.0)
    assert (d.replica, d.action, d.evict) == ("r1", "hit", ())
    assert set(d.scores) == {"r0", "r1", "r2"}
    assert d.scores["r1"] == max(d.scores.values())


def test_default_joins_a_load_in_flight() -> None:
    replicas = [view("r0"), view("r1", res("a", state="loading"))]
    d = make_profile("default").pick(req("a"), replicas, 10.0)
    assert (d.replica, d.action, d.evict) == ("r1", "hit", ())


def test_default_loads_onto_free_slot_least_loaded_replica() -> None:
    full = view("full", res("x"), res("y"), max_adapters=2, inflight=0)
    busy = view("busy", res("z", inflight=40), max_adapters=2)
    calm = view("calm", res("w", inflight=5), max_adapters=2)
    d = make_profile("default").pick(req("a"), [full, busy, calm], 100.0)
    assert (d.replica, d.action, d.evict) == ("calm", "load", ())


def test_default_evicts_lru_idle_and_never_an_adapter_in_flight() -> None:
    r0 = view(
        "r0",
        res("old-busy", last_used=1.0, inflight=2),
        res("older-idle", last_used=2.0),
        res("newer-idle", last_used=8.0),
        res("loading", last_used=0.0, state="loading"),
        max_adapters=4,
        max_loras=4,
    )
    d = make_profile("default").pick(req("a"), [r0], 10.0)
    assert (d.replica, d.action, d.evict) == ("r0", "load", ("older-idle",))


def test_default_evicts_as_many_as_needed_when_over_max_adapters() -> None:
    r0 = view(
        "r0", res("a1", last_used=3.0), res("a2", last_used=1.0), res("a3", last_used=2.0), max_adapters=2
    )
    d = make_profile("default").pick(req("new"), [r0], 10.0)
    assert d.evict == ("a2", "a3")


def test_default_no_capacity_when_every_adapter_is_in_flight() -> None:
    busy = [view(f"r{i}", res("x", inflight=1), res("y", inflight=1), max_adapters=2) for i in range(2)]
    for name in ALL:
        d = make_profile(name).pick(req("a"), busy, 1.0)
        assert (d.replica, d.action) == (None, "none"), name
        assert "can-host" in d.reason


def test_default_prefers_replica_whose_running_set_has_room() -> None:
    # r0 is lighter but already runs max_loras (2) distinct adapters: "a" would be deferred there.
    r0 = view("r0", res("x", inflight=1), res("y", inflight=1), max_loras=2, max_adapters=8)
    r1 = view("r1", res("z", inflight=10), max_loras=2, max_adapters=8)
    d = make_profile("default").pick(req("a"), [r0, r1], 1.0)
    assert (d.replica, d.action) == ("r1", "load")
    # Same when "a" is resident but idle on the full replica: replicate rather than stall.
    r0b = view("r0", res("a"), res("x", inflight=1), res("y", inflight=1), max_loras=2, max_adapters=8)
    d = make_profile("default").pick(req("a"), [r0b, r1], 1.0)
    assert (d.replica, d.action) == ("r1", "replicate")


def test_default_base_requests_go_to_least_loaded() -> None:
    replicas = [
        view("r0", res("x", inflight=3), max_loras=1),
        view("r1", inflight=1, waiting=0),
        view("r2", inflight=0, waiting=2),
    ]
    d = make_profile("default").pick(req(None), replicas, 1.0)
    assert (d.replica, d.action, d.evict) == ("r1", "hit", ())


def test_default_honours_exclude_and_health() -> None:
    replicas = [view("r0", res("a")), view("r1", healthy=False), view("r2")]
    d = make_profile("default").pick(req("a", exclude=("r0",)), replicas, 1.0)
    assert (d.replica, d.action) == ("r2", "replicate")
    d = make_profile("default").pick(req("a", exclude=("r0", "r2")), replicas, 1.0)
    assert (d.replica, d.action) == (None, "none")
    assert make_profile("default").pick(req("a"), [], 1.0).replica is None


def test_unhealthy_replicas_are_never_chosen_by_any_profile() -> None:
    replicas = [view(f"r{i}", healthy=(i == 3)) for i in range(5)]
    for name in ALL:
        p = make_profile(name)
        assert {p.pick(req("a"), replicas, 1.0).replica for _ in range(20)} == {"r3"}, name


def _apply(replicas: list[ReplicaView], url: str, name: str, evict: tuple[str, ...], now: float) -> list:
    """Record a load of ``name`` onto ``url`` (after unloading ``evict``) in the snapshot."""
    out = []
    for v in replicas:
        if v.url == url:
            kept = [r for r in v.residents.values() if r.lora_name not in evict]
            kept.append(res(name, last_used=now))
            v = view(v.url, *kept, max_adapters=v.max_adapters, max_loras=v.max_loras, inflight=v.inflight)
        out.append(v)
    return out


def test_default_replicates_hot_adapter_once_under_oscillating_load() -> None:
    profile = make_profile("default", high_water=0.8, adapter_high=0.9, low_water=0.1)
    cap = 100
    replicas = [
        view("r0", res("hot", inflight=79), max_num_seqs=cap, max_loras=4),
        # r1 is full, its one adapter idle for long (cheap to evict: a copy may go there).
        view("r1", res("cold1", last_used=-1000.0), max_num_seqs=cap, max_loras=4, max_adapters=1),
        view("r2", res("x", inflight=60), res("y", inflight=10), max_num_seqs=cap, max_adapters=2),
    ]
    actions = []
    for step in range(40):
        # r0's load oscillates around the high-water mark (0.79 / 0.81).
        hot_on_r0 = 81 if step % 2 else 79
        r1 = replicas[1]
        hot_r1 = r1.residents.get("hot")
        r1_res = [
            res(r.lora_name, last_used=r.last_used, inflight=(20 if r.lora_name == "hot" else 0))
            for r in r1.residents.values()
        ]
        replicas = [
            view("r0", res("hot", inflight=hot_on_r0), max_num_seqs=cap, max_loras=4),
            view("r1", *r1_res, max_num_seqs=cap, max_loras=4, max_adapters=1),
            replicas[2],
        ]
        d = profile.pick(req("hot"), replicas, float(step))
        actions.append((d.action, d.replica))
        if d.action == "replicate":
            assert d.replica == "r1" and hot_r1 is None
            assert d.evict == ("cold1",)
            replicas = _apply(replicas, "r1", "hot", d.evict, float(step))
    assert [a for a in actions if a[0] != "hit"] == [("replicate", "r1")]
    assert {r for a, r in actions if a == "hit"} <= {"r0", "r1"}


def test_default_keeps_idle_copy_of_hot_adapter_when_evicting() -> None:
    profile = make_profile("default", low_water=0.1)
    cap = 100
    # "hot" is idle on r1 right now but has 30 in flight on r0: r1's copy must survive.
    r0 = view("r0", res("hot", inflight=30), res("b", inflight=50), max_num_seqs=cap, max_adapters=2)
    r1 = view(
        "r1",
        res("hot", last_used=1.0),
        res("cold", last_used=2.0),
        max_num_seqs=cap,
        max_adapters=2,
        max_loras=4,
    )
    d = profile.pick(req("new"), [r0, r1], 10.0)
    assert (d.replica, d.action, d.evict) == ("r1", "load", ("cold",))
    # Once demand for it is below the low-water mark the LRU order applies again.
    r0_quiet = view("r0", res("hot", inflight=2), res("b", inflight=50), max_num_seqs=cap, max_adapters=2)
    d = profile.pick(req("new"), [r0_quiet, r1], 10.0)
    assert d.evict == ("hot",)


def test_default_consolidates_copies_when_demand_falls() -> None:
    profile = make_profile("default", low_water=0.1)
    r0 = view("r0", res("a", inflight=2, last_used=9.0), max_num_seqs=100, max_loras=4)
    r1 = view("r1", res("a", inflight=1, last_used=9.5), max_num_seqs=100, max_loras=4)
    assert profile.pick(req("a"), [r0, r1], 10.0).replica == "r0"
    assert profile.pick(req("a"), [r1, r0], 10.0).replica == "r0"


# ---------------------------------------------------------------- baselines


def test_round_robin_cycles_and_still_evicts_lru() -> None:
    replicas = [
        view(f"r{i}", res("x", last_used=1.0), res("y", last_used=2.0), max_adapters=2) for i in range(3)
    ]
    p = make_profile("round-robin")
    ds = [p.pick(req("a"), replicas, 5.0) for _ in range(4)]
    assert [d.replica for d in ds] == ["r0", "r1", "r2", "r0"]
    assert all(d.evict == ("x",) and d.action == "load" for d in ds)


def test_least_request_picks_fewest_in_flight() -> None:
    replicas = [view("r0", inflight=5), view("r1", inflight=2), view("r2", inflight=9)]
    d = make_profile("least-request").pick(req("a"), replicas, 1.0)
    assert d.replica == "r1"


def test_random_is_seeded() -> None:
    replicas = [view(f"r{i}") for i in range(4)]
    a = make_profile("random", seed=3)
    b = make_profile("random", seed=3)
    seq = [a.pick(req("x"), replicas, 1.0).replica for _ in range(30)]
    assert seq == [b.pick(req("x"), replicas, 1.0).replica for _ in range(30)]
    assert len(set(seq)) == 4


def test_gie_lora_affinity_reads_only_lora_requests_info() -> None:
    # r0 holds "a" resident but idle: invisible to GIE, which prefers the replica with spare
    # max_lora room; the default profile goes to the resident copy.
    r0 = view("r0", res("a"), lora_running=("b", "c"), lora_waiting=("b", "c"), max_loras=2)
    r1 = view("r1", lora_running=("d",), lora_waiting=("d",), max_loras=2)
    d = make_profile("gie-lora-affinity").pick(req("a"), [r0, r1], 1.0)
    assert (d.replica, d.action) == ("r1", "replicate")
    assert d.scores == {"r0": pytest.approx(2.0), "r1": pytest.approx(2.8)}
    # Listed as running: 1.0, queue and kv-cache decide the rest.
    r2 = view("r2", lora_running=("a",), lora_waiting=("a",), waiting=3, kv=0.5)
    d = make_profile("gie-lora-affinity").pick(req("a"), [r1, r2], 1.0)
    assert d.replica == "r1"  # 0.8 + 1 + 1 beats 1.0 + 0 + 0.5
    d = make_profile("gie-lora-affinity", queue_weight=0.0, kv_weight=0.0).pick(req("a"), [r1, r2], 1.0)
    assert d.replica == "r2"


def test_gie_breaks_ties_randomly_but_deterministically() -> None:
    replicas = [view(f"r{i}") for i in range(4)]
    seq = [make_profile("gie-lora-affinity", seed=5).pick(req("a"), replicas, 1.0).replica for _ in range(3)]
    assert len(set(seq)) == 1
    p = make_profile("gie-lora-affinity", seed=5)
    assert len({p.pick(req("a"), replicas, 1.0).replica for _ in range(40)}) == 4


def test_default_is_deterministic() -> None:
    replicas = [view(f"r{i}", res(f"x{i}", inflight=i)) for i in range(4)]
    first = [make_profile("default").pick(req(f"n{k}"), replicas, 1.0) for k in range(10)]
    again = [make_profile("default").pick(req(f"n{k}"), replicas, 1.0) for k in range(10)]
    assert first == again


# ---------------------------------------------------------------- configuration


def test_profile_from_config_parses_json_params() -> None:
    p = profile_from_config("default", '{"high_water": 0.5, "weights": {"load": 4}}')
    assert p.name == "default"
    assert dict((s.name, w) for s, w in p.scorers)["load"] == 4.0
    assert profile_from_config("random", None).name == "random"
    assert profile_from_config("least-request", {}).name == "least-request"


@pytest.mark.parametrize(
    ("name", "params", "needle"),
    [
        ("nope", "{}", "unknown placement profile"),
        ("default", "[1]", "JSON object"),
        ("default", "{bad", "not valid JSON"),
        ("default", '{"bogus": 1}', "bad parameters"),
        ("default", '{"weights": {"magic": 1}}', "unknown scorer weights"),
        ("default", '{"low_water": 0.9, "high_water": 0.5}', "low_water"),
        ("custom", '{"scorers": ["nope"]}', "unknown scorer"),
        ("custom", '{"picker": ["random", {"bad": 1}]}', "bad parameters for picker"),
    ],
)
def test_profile_config_errors_are_value_errors(name: str, params: str, needle: str) -> None:
    with pytest.raises(ValueError, match=needle):
        profile_from_config(name, params)


def test_custom_profile_from_plugin_names() -> None:
    p = make_profile(
        "custom",
        filters=["healthy"],
        scorers=[["load", 2.0], ["gie-lora-affinity", 1.0, {"count": "sum"}]],
        picker=["weighted-random", {"seed": 1}],
    )
    desc = p.describe()
    assert desc["filters"] == ["healthy", "can-host"]  # can-host is always added
    assert desc["scorers"] == [["load", 2.0], ["gie-lora-affinity", 1.0]]
    replicas = [view("r0", inflight=100), view("r1")]
    assert p.pick(req("a"), replicas, 1.0).replica in {"r0", "r1"}
