"""The pure timing/scheduling model in virtual time: exact numbers (as vLLM 0.32 does)."""

from __future__ import annotations

import itertools
import math

import pytest

from simulator.engine import EngineEvent, EngineModel, TimingParams


def _params(**kw: object) -> TimingParams:
    base: dict[str, object] = dict(
        load_fixed_s=0.0,
        load_bytes_per_s=math.inf,
        cpu_cache_reload_s=0.0,
        prefill_s_per_token=0.0,
        decode_base_s=0.01,
        decode_per_seq_s=0.0,
    )
    base.update(kw)
    return TimingParams(**base)  # type: ignore[arg-type]


def _by_kind(events: list[EngineEvent], kind: str) -> dict[str, float]:
    return {e.req_id: e.time for e in events if e.kind == kind}


def test_deferral_with_max_loras_1_matches_vllm_observation() -> None:
    eng = EngineModel(_params(max_loras=1, max_cpu_loras=2))
    eng.register_adapter("A", 0, 0.0)
    eng.register_adapter("B", 0, 0.0)
    for rid, lora in (("a1", "A"), ("a2", "A"), ("b1", "B"), ("b2", "B"), ("base", None)):
        eng.add_request(rid, lora, 10, 10, 0.0)
    eng.advance(0.0)
    assert (eng.running, eng.waiting, eng.waiting_deferred, eng.waiting_capacity) == (3, 2, 2, 0)
    assert eng.running_loras == ["A"]
    assert eng.waiting_loras == ["B"]
    assert eng.lora_info_adapters == []  # nothing has produced output yet
    eng.advance(0.015)
    assert eng.lora_info_adapters == ["A"]  # B is deferred-only: absent
    events = eng.advance(1.0)
    first = _by_kind(events, "first_token")
    done = _by_kind(events, "finished")
    # no preemption: B starts only after every A has finished (10 steps of 10 ms)
    assert done["a1"] == pytest.approx(0.10) and done["a2"] == pytest.approx(0.10)
    assert done["base"] == pytest.approx(0.10)
    assert first["b1"] == pytest.approx(0.11) and first["b2"] == pytest.approx(0.11)
    assert done["b1"] == pytest.approx(0.20)
    assert not eng.busy and eng.waiting_deferred == 0


def test_requests_behind_a_deferred_one_still_run() -> None:
    eng = EngineModel(_params(max_loras=1, max_cpu_loras=2))
    eng.register_adapter("A", 0, 0.0)
    eng.register_adapter("B", 0, 0.0)
    eng.add_request("a1", "A", 1, 5, 0.0)
    eng.add_request("b1", "B", 1, 5, 0.0)
    eng.add_request("a2", "A", 1, 5, 0.0)
    eng.add_request("base", None, 1, 5, 0.0)
    eng.advance(0.0)
    assert eng.running == 3 and eng.waiting_deferred == 1


def test_first_token_and_inter_token_latency_formula() -> None:
    p = _params(decode_base_s=0.01, decode_per_seq_s=0.001, prefill_s_per_token=0.0001)
    eng = EngineModel(p)
    eng.add_request("r", None, 100, 5, 0.0, want_tokens=True)
    events = eng.advance(10.0)
    tokens = [e.time for e in events if e.kind == "token"]
    assert tokens[0] == pytest.approx(0.01 + 0.001 + 100 * 0.0001)
    gaps = [b - a for a, b in itertools.pairwise(tokens)]
    assert gaps == pytest.approx([0.011] * 4)
    fin = next(e for e in events if e.kind == "finished")
    assert fin.time == pytest.approx(0.021 + 4 * 0.011) and fin.index == 5
    assert fin.times is not None and fin.times.first_token_at == pytest.approx(0.021)


def test_time_scale_speeds_everything_up() -> None:
    slow = EngineModel(_params(decode_base_s=0.02, load_fixed_s=0.5))
    fast = EngineModel(_params(decode_base_s=0.02, load_fixed_s=0.5, time_scale=0.1))
    assert slow.register_adapter("A", 0, 0.0).ready_at == pytest.approx(0.5)
    assert fast.register_adapter("A", 0, 0.0).ready_at == pytest.approx(0.05)
    for eng in (slow, fast):
        eng.add_request("r", None, 1, 3, 1.0)
    assert _by_kind(slow.advance(5.0), "finished")["r"] == pytest.approx(1.06)
    assert _by_kind(fast.advance(5.0), "finished")["r"] == pytest.approx(1.006)


def test_cold_reload_costs_load_time_cpu_cache_hit_is_cheap() -> None:
    p = dict(load_fixed_s=0.1, load_bytes_per_s=1e6, cpu_cache_reload_s=0.005, max_loras=1)
    # CPU cache of 1: registering B evicts A everywhere → A must be re-read from disk
    eng = EngineModel(_params(**p, max_cpu_loras=1))
    a = eng.register_adapter("A", 100_000, 0.0)
    assert a.ready_at == pytest.approx(0.2)
    b = eng.register_adapter("B", 100_000, 0.0)
    assert b.ready_at == pytest.approx(0.4)  # the engine loads one adapter at a time
    eng.add_request("r", "A", 1, 1, 1.0)
    assert _by_kind(eng.advance(2.0), "first_token")["r"] == pytest.approx(1.0 + 0.01 + 0.2)
    assert eng.state()["adapters"]["1"]["disk_loads"] == 2  # type: ignore[index]
    # CPU cache of 2: A is still in host memory → only the slot copy
    eng = EngineModel(_params(**p, max_cpu_loras=2))
    eng.register_adapter("A", 100_000, 0.0)
    eng.register_adapter("B", 100_000, 0.0)
    eng.add_request("r", "A", 1, 1, 1.0)
    assert _by_kind(eng.advance(2.0), "first_token")["r"] == pytest.approx(1.0 + 0.01 + 0.005)
    assert eng.total_cpu_reloads == 1
    # already in the GPU slot: no extra cost
    eng.add_request("r2", "A", 1, 1, 3.0)
    assert _by_kind(eng.advance(4.0), "first_token")["r2"] == pytest.approx(3.01)


def test_gpu_slots_and_cpu_cache_are_lru() -> None:
    eng = EngineModel(_params(max_loras=2, max_cpu_loras=3))
    ids = {n: eng.register_adapter(n, 0, 0.0).lora_id for n in "ABC"}
    assert eng.gpu_slots() == [ids["B"], ids["C"]]
    assert eng.cpu_cache() == [ids["A"], ids["B"], ids["C"]]
    eng.add_request("r", "A", 1, 1, 1.0)
    eng.advance(2.0)
    assert eng.gpu_slots() == [ids["C"], ids["A"]]  # B was least recently used
    assert eng.cpu_cache() == [ids["B"], ids["C"], ids["A"]]
    ids["D"] = eng.register_adapter("D", 0, 3.0).lora_id
    assert eng.cpu_cache() == [ids["C"], ids["A"], ids["D"]]  # B evicted from the host cache
    assert ids["B"] not in eng.gpu_slots()


def test_unregister_keeps_residency_and_reload_gets_a_new_id() -> None:
    eng = EngineModel(_params(max_loras=2, max_cpu_loras=2))
    first = eng.register_adapter("A", 0, 0.0).lora_id
    assert eng.unregister_adapter("A") is True
    assert eng.unregister_adapter("A") is False
    assert first in eng.gpu_slots() and eng.lora_id("A") is None
    with pytest.raises(KeyError):
        eng.add_request("r", "A", 1, 1, 0.0)
    second = eng.register_adapter("A", 0, 1.0).lora_id
    assert second != first
    assert eng.gpu_slots() == [first, second]  # the stale copy still holds a slot (vLLM #42633)


def test_inplace_keeps_the_id_and_rereads() -> None:
    eng = EngineModel(_params(load_fixed_s=0.05))
    a = eng.register_adapter("A", 0, 0.0)
    again = eng.register_adapter("A", 0, 1.0, inplace=True)
    assert again.lora_id == a.lora_id
    assert again.ready_at == pytest.approx(1.05)
    assert eng.state()["adapters"][str(a.lora_id)]["disk_loads"] == 2  # type: ignore[index]


def test_max_num_seqs_caps_running_and_counts_capacity_waits() -> None:
    eng = EngineModel(_params(max_num_seqs=2))
    for i in range(3):
        eng.add_request(f"r{i}", None, 1, 3, 0.0)
    eng.advance(0.0)
    assert (eng.running, eng.waiting, eng.waiting_capacity, eng.waiting_deferred) == (2, 1, 1, 0)
    done = _by_kind(eng.advance(1.0), "finished")
    assert done["r2"] == pytest.approx(0.06)


def test_kv_cache_usage_and_capacity() -> None:
    eng = EngineModel(_params(kv_cache_tokens=1000))
    eng.add_request("a", None, 600, 10, 0.0)
    eng.add_request("b", None, 600, 10, 0.0)  # does not fit next to a
    eng.advance(0.0)
    assert eng.running == 1 and eng.waiting_capacity == 1
    eng.advance(0.015)
    assert eng.kv_cache_usage == pytest.approx(0.601)


def test_loading_delays_the_next_step() -> None:
    eng = EngineModel(_params(load_fixed_s=0.1))
    eng.add_request("r", None, 1, 3, 0.0, want_tokens=True)
    eng.advance(0.005)  # first step runs 0.00 → 0.01
    eng.register_adapter("A", 0, 0.005)  # add_lora runs 0.01 → 0.11 between steps
    tokens = [e.time for e in eng.advance(1.0) if e.kind == "token"]
    assert tokens == pytest.approx([0.01, 0.12, 0.13])


def test_macro_steps_equal_single_steps() -> None:
    def run(step: float | None) -> list[tuple[str, str, float, int]]:
        eng = EngineModel(_params(decode_per_seq_s=0.001, max_loras=1, max_cpu_loras=1, load_fixed_s=0.03))
        eng.register_adapter("A", 0, 0.0)
        eng.register_adapter("B", 0, 0.0)
        out: list[EngineEvent] = []
        arrivals = [(0.0, "a", "A", 7), (0.05, "b", "B", 3), (0.051, "c", None, 12), (0.3, "d", "A", 4)]
        t = 0.0
        for at, rid, lora, n in arrivals:
            if step is None:
                out += eng.advance(at)
            else:
                while t < at:
                    t = min(at, t + step)
                    out += eng.advance(t)
            eng.add_request(rid, lora, 5, n, at, want_tokens=rid == "c")
        out += eng.advance(10.0)
        return [(e.kind, e.req_id, round(e.time, 9), e.index) for e in out]

    coarse = run(None)
    assert coarse == run(0.0007)
    assert len([e for e in coarse if e[0] == "finished"]) == 4


def test_zero_params_finish_instantly_and_validate() -> None:
    eng = EngineModel(TimingParams.zero(max_loras=2))
    assert TimingParams.zero().is_zero
    eng.register_adapter("A", 10**9, 0.0)
    eng.add_request("r", "A", 100, 50, 5.0)
    events = eng.advance(5.0)
    assert [e.kind for e in events] == ["first_token", "finished"]
    assert all(e.time == 5.0 for e in events) and events[-1].index == 50
    assert eng.next_event_time() is None
    with pytest.raises(ValueError, match=r"max_cpu_loras \(1\) must be >= max_loras \(2\)\."):
        TimingParams(max_loras=2, max_cpu_loras=1)


def test_abort_frees_the_slot() -> None:
    eng = EngineModel(_params(max_num_seqs=1))
    eng.add_request("a", None, 1, 100, 0.0)
    eng.add_request("b", None, 1, 2, 0.0)
    eng.advance(0.0)
    assert eng.abort_request("a", 0.005) is True
    assert eng.abort_request("a", 0.005) is False
    done = _by_kind(eng.advance(1.0), "finished")
    assert "a" not in done and done["b"] == pytest.approx(0.03)
