"""Placement profiles: the default policy's decisions, the baselines, config and determinism."""

from __future__ import annotations

import pytest

from router.placement import BASELINES, PROFILES, SchedulerProfile, make_profile, profile_from_config
from router.placement.default import DefaultPolicy
from router.placement.types import PlacementRequest, Profile
from tests.router.test_placement_support import req, res, view

ALL = ("default", *BASELINES)


def test_registry_lists_default_and_baselines() -> None:
    assert set(ALL) <= set(PROFILES)
    for name in ALL:
        p: Profile = make_profile(name)
        assert p.name == name


def test_no_profile_places_where_every_adapter_is_in_flight() -> None:
    busy = [view(f"r{i}", res("x", inflight=1), res("y", inflight=1), max_adapters=2) for i in range(2)]
    for name in ALL:
        d = make_profile(name).pick(req("a"), busy, 1.0)
        assert (d.replica, d.action) == (None, "none"), name


def test_unhealthy_replicas_are_never_chosen_by_any_profile() -> None:
    replicas = [view(f"r{i}", healthy=(i == 3)) for i in range(5)]
    for name in ALL:
        p = make_profile(name)
        assert {p.pick(req("a"), replicas, 1.0).replica for _ in range(20)} == {"r3"}, name


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
    assert [(d.replica, d.action, d.evict) for d in first] == [(d.replica, d.action, d.evict) for d in again]


def test_llm_d_profile_prefers_the_cached_prefix_then_the_short_queue() -> None:
    r0 = view("r0", lora_running=("a",), lora_waiting=("a",), waiting=4)
    r1 = view("r1", lora_running=("b",), lora_waiting=("b",))
    cached = PlacementRequest(lora_name="a", adapter_id="a", prompt_tokens=100, prefix={"r0": 100})
    assert make_profile("llm-d").pick(cached, [r0, r1], 1.0).replica == "r0"  # 2·0 + 3·1 + 1 vs 2·1 + 0.8
    cold = PlacementRequest(lora_name="a", adapter_id="a", prompt_tokens=100)
    assert make_profile("llm-d").pick(cold, [r0, r1], 1.0).replica == "r1"


# ---------------------------------------------------------------- configuration


def test_profile_from_config_parses_json_params() -> None:
    p = profile_from_config("default", '{"defer_s": 2.5, "choices": 6}')
    assert isinstance(p, DefaultPolicy)
    assert p.name == "default" and p.costs.defer_s == 2.5 and p.choices == 6
    assert profile_from_config("random", None).name == "random"
    assert profile_from_config("least-request", {}).name == "least-request"


@pytest.mark.parametrize(
    ("name", "params", "needle"),
    [
        ("nope", "{}", "unknown placement profile"),
        ("default", "[1]", "JSON object"),
        ("default", "{bad", "not valid JSON"),
        ("default", '{"bogus": 1}', "unknown parameters"),
        ("default", '{"defer_s": -1}', "finite number"),
        ("default", '{"choices": 0}', "integer >= 1"),
        ("default", '{"load_bytes_per_s": 0}', "must be > 0"),
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
    assert isinstance(p, SchedulerProfile)
    desc = p.describe()
    assert desc["filters"] == ["healthy", "can-host"]  # can-host is always added
    assert desc["scorers"] == [["load", 2.0], ["gie-lora-affinity", 1.0]]
    replicas = [view("r0", inflight=100), view("r1")]
    assert p.pick(req("a"), replicas, 1.0).replica in {"r0", "r1"}
