"""``/metrics`` against real vLLM 0.32's families, and the values the simulator's activity puts there.

``data/vllm-0.32-metrics.txt`` is what vLLM 0.32's own ``PrometheusStatLogger`` exposes (made by
``data/vllm_metrics_reference.py`` with the engine tier's vLLM; no server needed).
"""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from simulator.config import SimConfig
from simulator.engine import EngineModel, TimingParams
from simulator.metrics import request_tokens_buckets
from simulator.textgen import count_tokens, render_chat
from tests.simulator.simutil import sim_client

REFERENCE = Path(__file__).parent / "data" / "vllm-0.32-metrics.txt"
# label values that depend on the run (adapter names, cache sizes): compare label names only
_INFO = {"vllm:lora_requests_info", "vllm:cache_config_info"}

Samples = dict[str, list[tuple[dict[str, str], float]]]


def _structure(text: str) -> list[tuple[str, str, str, list[tuple[str, Any]]]]:
    """Families in order: (name, type, help, [(sample name, labels)]) — values left out."""
    out = []
    for fam in text_string_to_metric_families(text):
        if not fam.name.startswith("vllm:"):
            continue
        samples: list[tuple[str, Any]] = [
            (s.name, sorted(s.labels) if fam.name in _INFO else sorted(s.labels.items())) for s in fam.samples
        ]
        out.append((fam.name, fam.type, fam.documentation, samples))
    return out


def _wire_names(text: str) -> set[str]:
    """As the engine tier's ``_metric_names``: the sample names on ``vllm:`` lines."""
    return {re.split(r"[{ ]", ln, maxsplit=1)[0] for ln in text.splitlines() if ln.startswith("vllm:")}


def _samples(text: str) -> Samples:
    out: Samples = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out.setdefault(s.name, []).append((dict(s.labels), s.value))
    return out


def _one(s: Samples, name: str) -> float:
    (labels, value), *rest = s[name]
    assert not rest, name
    assert labels.get("model_name") == "demo-base" and labels.get("engine") == "0", (name, labels)
    return value


async def test_metrics_have_exactly_vllms_families_types_help_and_labels() -> None:
    """Same families, types, help texts, sample names, label names/values and buckets, in the same
    order as vLLM 0.32 (``vllm serve --enable-lora --max-loras 4 --max-model-len 8192``)."""
    reference = REFERENCE.read_text()
    async with sim_client() as (c, _):
        assert (await c.post("/v1/completions", json={"prompt": "a b c", "max_tokens": 2})).status_code == 200
        text = (await c.get("/metrics")).text
    assert _wire_names(text) == _wire_names(reference)
    assert _structure(text) == _structure(reference)


async def test_new_families_types_and_labels() -> None:
    async with sim_client() as (c, _):
        before = time.time()
        await c.post("/v1/completions", json={"prompt": "a b c", "max_tokens": 2})
        text = (await c.get("/metrics")).text
    types = {fam.name: fam.type for fam in text_string_to_metric_families(text)}
    for name in (
        "vllm:admission_rejections",
        "vllm:estimated_flops_per_gpu",
        "vllm:estimated_read_bytes_per_gpu",
        "vllm:estimated_write_bytes_per_gpu",
        "vllm:external_prefix_cache_hits",
        "vllm:external_prefix_cache_queries",
        "vllm:mm_cache_hits",
        "vllm:mm_cache_queries",
        "vllm:prompt_tokens_by_source",
        "vllm:prompt_tokens_cached",
        "vllm:prompt_tokens_cached_by_source",
    ):
        assert types[name] == "counter", name
    for name in (
        "vllm:iteration_tokens_total",  # a histogram whose name ends in _total, as in vLLM
        "vllm:request_generation_tokens",
        "vllm:request_inference_time_seconds",
        "vllm:request_max_num_generation_tokens",
        "vllm:request_num_preemptions",
        "vllm:request_params_max_tokens",
        "vllm:request_params_n",
        "vllm:request_prefill_kv_computed_tokens",
        "vllm:request_prompt_tokens",
        "vllm:request_time_per_output_token_seconds",
    ):
        assert types[name] == "histogram", name
    assert types["vllm:engine_sleep_state"] == types["vllm:cache_config_info"] == "gauge"
    s = _samples(text)
    sleep = {lab["sleep_state"]: v for lab, v in s["vllm:engine_sleep_state"]}
    assert sleep == {"awake": 1.0, "weights_offloaded": 0.0, "discard_all": 0.0}
    # admission rejections carry model_name and reason only (no engine label), as in vLLM
    rejections = s["vllm:admission_rejections_total"]
    assert sorted(lab["reason"] for lab, _ in rejections) == ["max_num_queued_reqs", "max_num_queued_tokens"]
    assert all(set(lab) == {"model_name", "reason"} and v == 0 for lab, v in rejections)
    by_source = {lab["source"]: v for lab, v in s["vllm:prompt_tokens_by_source_total"]}
    assert by_source == {"local_compute": 3.0, "local_cache_hit": 0.0, "external_kv_transfer": 0.0}
    cached = {lab["source"] for lab, _ in s["vllm:prompt_tokens_cached_by_source_total"]}
    assert cached == {"device", "host", "p2p", "disk", "external_unspecified"}
    success = {lab["finished_reason"] for lab, _ in s["vllm:request_success_total"]}
    assert success == {"stop", "length", "abort", "error", "repetition"}
    # prometheus_client's created series: one per counter/histogram child, the set-up time
    created = [v for name, rows in s.items() if name.endswith("_created") for _, v in rows]
    # 12 single-child counters, by_source 3, cached 1, cached_by_source 5, success 5, admission 2,
    # 16 histograms
    assert len(created) == 12 + 3 + 1 + 5 + 5 + 2 + 16
    assert all(before - 60 < v <= time.time() for v in created)
    (info_labels, one), *_ = s["vllm:cache_config_info"]
    assert one == 1.0 and info_labels["engine"] == "0" and info_labels["block_size"] == "16"
    assert info_labels["num_gpu_blocks"] == str(400_000 // 16)


async def test_per_request_histograms_count_finished_requests() -> None:
    """Per finished choice (vLLM's child request) and per prompt (vLLM's parent request)."""
    chat_prompt = count_tokens(render_chat([{"role": "user", "content": "hello there"}]))
    async with sim_client() as (c, _):
        r1 = await c.post("/v1/completions", json={"prompt": "a b c", "max_tokens": 5, "n": 3})
        r2 = await c.post("/v1/completions", json={"prompt": ["x y", "p q r s"], "max_tokens": 4})
        r3 = await c.post(
            "/v1/chat/completions",
            json={"messages": [{"role": "user", "content": "hello there"}], "max_tokens": 7, "stream": True},
        )
        r4 = await c.post("/v1/completions", json={"prompt": "z"})  # default max_tokens 16
        assert {r.status_code for r in (r1, r2, r3, r4)} == {200}
        s = _samples((await c.get("/metrics")).text)
    finished = 3 + 2 + 1 + 1
    prompts = 3 * 3 + 2 + 4 + chat_prompt + 1
    generated = _one(s, "vllm:generation_tokens_total")
    assert generated == 3 * 5 + 2 * 4 + 7 + 16  # word salad never hits a stop string here
    assert _one(s, "vllm:prompt_tokens_total") == prompts
    assert _one(s, "vllm:prefix_cache_queries_total") == prompts  # every prompt token is looked up…
    assert _one(s, "vllm:prefix_cache_hits_total") == 0  # …and none is cached
    for hist in (
        "request_prompt_tokens",
        "request_generation_tokens",
        "request_params_max_tokens",
        "request_prefill_kv_computed_tokens",
        "request_num_preemptions",
        "request_time_per_output_token_seconds",
        "request_inference_time_seconds",
        "e2e_request_latency_seconds",
        "request_queue_time_seconds",
        "request_prefill_time_seconds",
        "request_decode_time_seconds",
        "time_to_first_token_seconds",
    ):
        assert _one(s, f"vllm:{hist}_count") == finished, hist
    assert _one(s, "vllm:request_prompt_tokens_sum") == prompts
    assert _one(s, "vllm:request_prefill_kv_computed_tokens_sum") == prompts  # nothing cached
    assert _one(s, "vllm:request_generation_tokens_sum") == generated
    assert _one(s, "vllm:request_params_max_tokens_sum") == 3 * 5 + 2 * 4 + 7 + 16
    assert _one(s, "vllm:request_num_preemptions_sum") == 0
    first = {lab["le"]: v for lab, v in s["vllm:request_num_preemptions_bucket"]}
    assert first["1.0"] == finished  # never preempted
    # one observation per prompt: n and the longest of its n choices
    assert _one(s, "vllm:request_params_n_count") == 5
    assert _one(s, "vllm:request_params_n_sum") == 3 + 1 + 1 + 1 + 1
    assert _one(s, "vllm:request_max_num_generation_tokens_count") == 5
    assert _one(s, "vllm:request_max_num_generation_tokens_sum") == 5 + 4 + 4 + 7 + 16
    n_buckets = {lab["le"]: v for lab, v in s["vllm:request_params_n_bucket"]}
    assert n_buckets == {"1.0": 4, "2.0": 4, "5.0": 5, "10.0": 5, "20.0": 5, "+Inf": 5}
    # iteration tokens: every prompt token and every generated token in some engine step
    assert _one(s, "vllm:iteration_tokens_total_sum") == prompts + generated
    assert _one(s, "vllm:num_preemptions_total") == 0
    ok = {lab["finished_reason"]: v for lab, v in s["vllm:request_success_total"]}
    assert ok["length"] + ok["stop"] == finished
    le = {lab["le"] for lab, _ in s["vllm:request_prompt_tokens_bucket"]}
    assert le == {*(repr(b) for b in request_tokens_buckets(8192)), "+Inf"}


async def test_request_tokens_buckets_follow_max_model_len() -> None:
    assert request_tokens_buckets(8192) == [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000]
    assert request_tokens_buckets(512) == [1, 2, 5, 10, 20, 50, 100, 200, 500]
    async with sim_client(max_model_len=100) as (c, _):
        s = _samples((await c.get("/metrics")).text)
    for hist in ("request_prompt_tokens", "request_params_max_tokens", "request_max_num_generation_tokens"):
        le = [lab["le"] for lab, _ in s[f"vllm:{hist}_bucket"]]
        assert le == ["1.0", "2.0", "5.0", "10.0", "20.0", "50.0", "100.0", "+Inf"], hist


async def test_timing_histograms_in_scaled_time() -> None:
    """inference = prefill + decode; time per output token = decode / (tokens - 1)."""
    timing = TimingParams.zero(decode_base_s=0.02)
    async with sim_client(SimConfig(timing=timing)) as (c, _):
        assert (await c.post("/v1/completions", json={"prompt": "a", "max_tokens": 5})).status_code == 200
        s = _samples((await c.get("/metrics")).text)
    prefill = _one(s, "vllm:request_prefill_time_seconds_sum")
    decode = _one(s, "vllm:request_decode_time_seconds_sum")
    assert _one(s, "vllm:request_inference_time_seconds_sum") == pytest.approx(prefill + decode, abs=1e-6)
    assert decode >= 4 * 0.02 * 0.9
    assert _one(s, "vllm:request_time_per_output_token_seconds_sum") == pytest.approx(decode / 4)
    assert _one(s, "vllm:iteration_tokens_total_count") == 5  # five engine steps


def test_engine_reports_tokens_per_step_including_macro_steps() -> None:
    steps: list[tuple[int, int]] = []
    eng = EngineModel(TimingParams.zero(decode_base_s=0.01))
    eng.on_iteration = lambda tokens, count: steps.append((tokens, count))
    eng.add_request("a", None, 10, 4, 0.0)
    eng.add_request("b", None, 20, 6, 0.0)
    eng.advance(100.0)
    per_step = [tokens for tokens, count in steps for _ in range(count)]
    # step 1 prefills both (30 prompt tokens) and gives each its first token; then decode steps
    assert per_step == [32, 2, 2, 2, 1, 1]
    assert sum(per_step) == 30 + 4 + 6
    assert len(per_step) == eng.steps
    assert any(count > 1 for _, count in steps)  # decode-only stretches come as macro-steps
