"""Conformance: SIM's script against a real vLLM replica and against a simulator process, plus a
differential probe that sends the same requests to both and compares what a client can observe.

Real vLLM is the reference: every check must pass against it. A difference on the simulator is
a simulator bug, reported with the request, vLLM's answer and the simulator's answer.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from simulator.procs import SimProcess
from tests.engine import vllm_env as ve
from tests.engine.conftest import ENGINE_MARKS, EngineAdapters

pytestmark = ENGINE_MARKS

BASE = ve.SERVED_NAME


@pytest.fixture(scope="module")
def simulator_url() -> Iterator[str]:
    """A simulator process configured like the real replicas (same flags that matter)."""
    sim = SimProcess(
        model=BASE,
        extra_args=[
            "--max-model-len", str(ve.MAX_MODEL_LEN),
            "--max-loras", str(ve.MAX_LORAS),
            "--max-cpu-loras", str(ve.MAX_CPU_LORAS),
            "--max-lora-rank", str(ve.MAX_LORA_RANK),
            # the real replicas run vLLM's multiproc executor, which wraps engine-side errors
            "--wrap-worker-errors",
        ],
        env={"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True"},
        ready_timeout=60,
    )  # fmt: skip
    try:
        sim.start().wait_ready()
        yield sim.url
    finally:
        sim.cleanup()


def _conformance(url: str, adapters: EngineAdapters) -> dict[str, Any]:
    from simulator.conformance import run_conformance

    report = run_conformance(
        url, model=BASE, adapter_dir=str(adapters.a1), bad_rank_dir=str(adapters.bad_rank)
    )
    out: dict[str, Any] = report.as_dict()
    return out


def test_conformance_script_passes_against_real_vllm(vllm_url: str, engine_adapters: EngineAdapters) -> None:
    report = _conformance(vllm_url, engine_adapters)
    failed = [c for c in report["checks"] if not c["ok"]]
    assert report["passed"] > 20
    assert not failed, json.dumps(failed, indent=1)


def test_conformance_script_passes_against_simulator(
    simulator_url: str, vllm_url: str, engine_adapters: EngineAdapters
) -> None:
    sim = _conformance(simulator_url, engine_adapters)
    failed = [c for c in sim["checks"] if not c["ok"]]
    assert not failed, json.dumps(failed, indent=1)


# --------------------------------------------------------------------------- differential probe

_HEX = re.compile(r"[0-9a-f]{8,}")


def _norm(text: str, name: str, paths: list[Path]) -> str:
    for p in paths:
        text = text.replace(str(p), "<dir>")
    return _HEX.sub("<hex>", text.replace(name, "<name>"))


def _observe(c: httpx.Client, method: str, path: str, body: Any, *, name: str, paths: list[Path]) -> Any:
    if isinstance(body, bytes):
        r = c.request(method, path, content=body, headers={"content-type": "text/plain"})
    else:
        r = c.request(method, path, json=body)
    ctype = r.headers.get("content-type")
    try:
        parsed = r.json()
    except ValueError:
        parsed = None
    if isinstance(parsed, dict) and isinstance(parsed.get("error"), dict):
        e = parsed["error"]
        shape: Any = {
            "keys": sorted(e),
            "type": e.get("type"),
            "param": e.get("param"),
            "code": e.get("code"),
            "message": _norm(str(e.get("message")), name, paths),
        }
    elif parsed is not None:
        shape = _norm(json.dumps(parsed, sort_keys=True), name, paths) if r.status_code != 200 else "json"
    else:
        shape = _norm(r.text, name, paths)
    return {"status": r.status_code, "content-type": ctype, "body": shape}


def _script(adapters: EngineAdapters, name: str) -> list[tuple[str, str, str, Any]]:
    load, unload = "/v1/load_lora_adapter", "/v1/unload_lora_adapter"
    return [
        ("load missing lora_path", "POST", load, {"lora_name": name}),
        ("load empty name", "POST", load, {"lora_name": "", "lora_path": str(adapters.a1)}),
        ("load base name", "POST", load, {"lora_name": BASE, "lora_path": str(adapters.a1)}),
        ("load wrong content-type", "POST", load, b"lora_name=x"),
        ("GET load endpoint", "GET", load, None),
        ("load ok", "POST", load, {"lora_name": name, "lora_path": str(adapters.a1)}),
        ("load again", "POST", load, {"lora_name": name, "lora_path": str(adapters.a1)}),
        (
            "load in place",
            "POST",
            load,
            {"lora_name": name, "lora_path": str(adapters.a1), "load_inplace": True},
        ),
        (
            "load no adapter at path",
            "POST",
            load,
            {"lora_name": name + "x", "lora_path": str(adapters.root / "nope")},
        ),
        ("load bad rank", "POST", load, {"lora_name": name + "r", "lora_path": str(adapters.bad_rank)}),
        ("unknown model", "POST", "/v1/completions", {"model": "nosuch", "prompt": "x", "max_tokens": 1}),
        (
            "stream_options without stream",
            "POST",
            "/v1/chat/completions",
            {
                "model": name,
                "messages": [{"role": "user", "content": "x"}],
                "max_tokens": 1,
                "stream_options": {"include_usage": True},
            },
        ),
        ("unload ok", "POST", unload, {"lora_name": name}),
        ("unload again", "POST", unload, {"lora_name": name}),
        ("unload empty name", "POST", unload, {"lora_name": ""}),
    ]


def _sse_shape(c: httpx.Client, name: str) -> list[Any]:
    body = {
        "model": name,
        "messages": [{"role": "user", "content": "hello"}],
        "max_tokens": 3,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    with c.stream("POST", "/v1/chat/completions", json=body) as r:
        raw = r.read().decode()
    shape: list[Any] = [r.headers.get("content-type")]
    for ev in raw.split("\n\n"):
        if not ev:
            continue
        if ev == "data: [DONE]":
            shape.append("[DONE]")
            continue
        obj = json.loads(ev.removeprefix("data: "))
        ch = obj["choices"][0] if obj["choices"] else {}
        shape.append(
            {
                "keys": sorted(obj),
                "choice_keys": sorted(ch),
                "delta_keys": sorted(ch.get("delta", {})),
                "finish": ch.get("finish_reason"),
            }
        )
    # content chunks repeat per token: compare first, last two and [DONE]
    return shape[:3] + shape[-3:]


def _metric_names(c: httpx.Client) -> set[str]:
    names = set()
    for line in c.get("/metrics").text.splitlines():
        if line.startswith("vllm:"):
            names.add(re.split(r"[{ ]", line, maxsplit=1)[0])
    return names


def _card_keys(c: httpx.Client) -> list[Any]:
    data = c.get("/v1/models").json()["data"]
    return [(sorted(card), sorted(card["permission"][0])) for card in data]


# The /metrics families (as vLLM 0.32 does) lists and the router reads: both servers must expose them.
CORE_METRICS = {
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
    "vllm:num_requests_waiting_by_reason",
    "vllm:kv_cache_usage_perc",
    "vllm:prompt_tokens_total",
    "vllm:generation_tokens_total",
    "vllm:request_success_total",
    "vllm:num_preemptions_total",
    "vllm:prefix_cache_queries_total",
    "vllm:prefix_cache_hits_total",
    "vllm:lora_requests_info",
    *(
        f"vllm:{h}_{suffix}"
        for h in (
            "time_to_first_token_seconds",
            "inter_token_latency_seconds",
            "e2e_request_latency_seconds",
            "request_queue_time_seconds",
            "request_prefill_time_seconds",
            "request_decode_time_seconds",
        )
        for suffix in ("bucket", "count", "sum")
    ),
}
STEPS = [
    *(step for step, *_ in _script(EngineAdapters(Path(), Path(), Path(), Path(), Path()), "x")),
    "models cards",
    "SSE framing",
]
# Differences seen on real vLLM 0.32 (CPU build) that the simulator does not reproduce: a check
# is xfail(strict) only while the simulator still differs, so a fix turns it into a failure to
# remove the mark.
KNOWN_SIM_DIFFERENCES: dict[str, str] = {}


@pytest.fixture(scope="module")
def probe(
    simulator_url: str, vllm_replicas: list[ve.VllmReplica], engine_adapters: EngineAdapters
) -> dict[str, dict[str, Any]]:
    """Same request script against both servers → ``{"vllm": {step: observation}, "sim": …}``."""
    paths = [engine_adapters.root, engine_adapters.a1, engine_adapters.bad_rank]
    results: dict[str, dict[str, Any]] = {}
    for label, url in (("vllm", vllm_replicas[0].url), ("sim", simulator_url)):
        name = f"diff-{label}-{os.urandom(3).hex()}"
        with httpx.Client(base_url=url, timeout=60) as c:
            res: dict[str, Any] = {}
            for step, method, path, body in _script(engine_adapters, name):
                res[step] = _observe(c, method, path, body, name=name, paths=paths)
                if step == "load in place":
                    res["models cards"] = _card_keys(c)
                    res["SSE framing"] = _sse_shape(c, name)
            res["metrics"] = _metric_names(c)
            results[label] = res
    assert results["vllm"]["load ok"]["status"] == 200
    return results


@pytest.mark.parametrize(
    "step",
    [
        pytest.param(s, marks=pytest.mark.xfail(strict=True, reason=KNOWN_SIM_DIFFERENCES[s]))
        if s in KNOWN_SIM_DIFFERENCES
        else s
        for s in STEPS
    ],
)
def test_simulator_answers_like_real_vllm(probe: dict[str, dict[str, Any]], step: str) -> None:
    """Same request to both: status, content-type, error envelope (type, param, code, message
    with names/paths normalised), card keys and SSE chunk shapes must be equal."""
    assert probe["sim"][step] == probe["vllm"][step], json.dumps(
        {"vllm": probe["vllm"][step], "sim": probe["sim"][step]}, indent=1
    )


def test_metrics_core_families_on_both(probe: dict[str, dict[str, Any]]) -> None:
    assert probe["vllm"]["metrics"] >= CORE_METRICS, sorted(CORE_METRICS - probe["vllm"]["metrics"])
    assert probe["sim"]["metrics"] >= CORE_METRICS, sorted(CORE_METRICS - probe["sim"]["metrics"])


def test_metrics_simulator_invents_no_family(probe: dict[str, dict[str, Any]]) -> None:
    extra = probe["sim"]["metrics"] - probe["vllm"]["metrics"]
    assert not extra, sorted(extra)


def test_metrics_simulator_has_every_vllm_family(probe: dict[str, dict[str, Any]]) -> None:
    missing = probe["vllm"]["metrics"] - probe["sim"]["metrics"]
    assert not missing, sorted(missing)
