"""Simulated behaviours per adapter, in process: error rate, refusals, JSON output, latency factor,
determinism per seed, and flipping a version at run time through ``/_sim/faults``."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import httpx
import orjson
from prometheus_client.parser import text_string_to_metric_families

from simulator.app import SimApp
from simulator.behaviours import parse_behaviours
from simulator.config import FaultState, SimConfig
from simulator.engine import TimingParams
from simulator.outputs import REFUSALS
from simulator.textgen import count_tokens
from tests.simulator.simutil import load, sim_client

MakeAdapter = Callable[..., str]
V1, V2, OTHER = "support@v1-aaaa", "support@v2-bbbb", "billing@v1-cccc"
GENERATION_ERROR = {
    "error": {"message": "Internal server error", "type": "InternalServerError", "param": None, "code": 500}
}
N = 400  # seeded requests per measured rate; the draws are deterministic, so are the counts


@asynccontextmanager
async def _sim(
    make_adapter: MakeAdapter, behaviours: dict[str, Any], **kw: Any
) -> AsyncIterator[tuple[httpx.AsyncClient, SimApp]]:
    config = SimConfig(
        faults=FaultState(behaviours=parse_behaviours(behaviours)), enable_fault_control=True, **kw
    )
    async with sim_client(config) as (c, app):
        for i, name in enumerate((V1, V2, OTHER)):
            assert (await load(c, name, make_adapter(name, seed=i + 1))).status_code == 200
        yield c, app


def _chat(model: str, seed: int | None, **extra: Any) -> dict[str, Any]:
    body = {"model": model, "messages": [{"role": "user", "content": "how do I reset my password"}], **extra}
    return body if seed is None else {**body, "seed": seed}


def _events(text: str) -> list[Any]:
    assert text.endswith("data: [DONE]\n\n"), text[-200:]
    out: list[Any] = []
    for block in text.split("\n\n")[:-1]:
        assert block.startswith("data: "), block
        payload = block.removeprefix("data: ")
        out.append(payload if payload == "[DONE]" else orjson.loads(payload))
    return out


def _stream_text(events: list[Any], chat: bool) -> str:
    parts = []
    for ev in events:
        if isinstance(ev, dict) and ev.get("choices"):
            ch = ev["choices"][0]
            parts.append((ch["delta"].get("content") or "") if chat else ch["text"])
    return "".join(parts)


async def test_error_rate_is_measured_per_adapter_and_answers_vllms_500(make_adapter: MakeAdapter) -> None:
    async with _sim(make_adapter, {"support@v2-*": {"error_rate": 0.2}}) as (c, _):
        codes: dict[str, list[int]] = {V1: [], V2: []}
        for seed in range(N):
            for model in (V1, V2):
                r = await c.post("/v1/chat/completions", json=_chat(model, seed, max_tokens=4))
                codes[model].append(r.status_code)
                if r.status_code == 500:
                    assert r.json() == GENERATION_ERROR
                    assert r.headers["content-type"] == "application/json"
        assert set(codes[V1]) == {200}  # the glob matches one version only
        rate = codes[V2].count(500) / N
        assert set(codes[V2]) == {200, 500} and abs(rate - 0.2) < 0.05, rate
        # vLLM counts the failed requests under finished_reason="error"
        text = (await c.get("/metrics")).text
        fams = {f.name: f for f in text_string_to_metric_families(text)}
        by_reason = {
            s.labels["finished_reason"]: s.value
            for s in fams["vllm:request_success"].samples
            if s.name.endswith("_total")
        }
        assert by_reason["error"] == codes[V2].count(500)


async def test_same_request_and_seed_same_behaviour_unseeded_varies(make_adapter: MakeAdapter) -> None:
    behaviours = {V2: {"error_rate": 0.5, "refusal_rate": 0.3}}
    async with _sim(make_adapter, behaviours) as (c, _):
        first = [
            await c.post("/v1/completions", json={"model": V2, "prompt": "p", "seed": s}) for s in range(60)
        ]
        again = [
            await c.post("/v1/completions", json={"model": V2, "prompt": "p", "seed": s}) for s in range(60)
        ]
        assert [r.status_code for r in first] == [r.status_code for r in again]
        assert [r.json().get("choices", [{}])[0].get("text") for r in first] == [
            r.json().get("choices", [{}])[0].get("text") for r in again
        ]
        assert {r.status_code for r in first} == {200, 500}
        # no seed: drawn afresh per request, like vLLM's unseeded sampling
        unseeded = {
            (await c.post("/v1/completions", json={"model": V2, "prompt": "p"})).status_code
            for _ in range(60)
        }
        assert unseeded == {200, 500}


async def test_streamed_errors_are_in_band_after_some_tokens(make_adapter: MakeAdapter) -> None:
    async with _sim(make_adapter, {V2: {"error_rate": 1.0}}) as (c, _):
        for chat in (True, False):
            path = "/v1/chat/completions" if chat else "/v1/completions"
            streamed = []
            for seed in range(30):
                body = (
                    _chat(V2, seed, max_tokens=8)
                    if chat
                    else {"model": V2, "prompt": "x", "seed": seed, "max_tokens": 8}
                )
                r = await c.post(
                    path, json={**body, "stream": True, "stream_options": {"include_usage": True}}
                )
                assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
                ev = _events(r.text)
                assert ev[-2] == GENERATION_ERROR and ev[-1] == "[DONE]"
                chunks = ev[:-2]
                assert all(not (ch.get("choices") or [{}])[0].get("finish_reason") for ch in chunks)
                assert not any(ch.get("usage") for ch in chunks)  # no usage chunk after a failure
                if chat:
                    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
                    chunks = chunks[1:]
                streamed.append(len(chunks))
            assert max(streamed) <= 7  # at most max_tokens - 1 tokens before the failing one
            assert len(set(streamed)) > 2  # the failure point varies with the request


async def test_stream_error_rate_fails_streams_with_vllms_generator_error(make_adapter: MakeAdapter) -> None:
    """``stream_error_rate``: the stream ends with vLLM's ``create_streaming_error_response`` (its
    ``json.dumps`` spacing, ``BadRequestError`` 400) and ``[DONE]`` on the HTTP 200, after some
    tokens; non-streamed answers of the same adapter, and other adapters, are unaffected."""
    async with _sim(make_adapter, {V2: {"stream_error_rate": 0.5}}) as (c, _):
        failed, streamed = 0, []
        for seed in range(40):
            body = {**_chat(V2, seed, max_tokens=8), "stream": True}
            r = await c.post("/v1/chat/completions", json=body)
            assert r.status_code == 200
            if '"error"' not in r.text:
                assert '"finish_reason":"length"' in r.text
                continue
            failed += 1
            tail = r.text.rpartition('data: {"error": {')[2]
            assert tail.endswith("}}\n\ndata: [DONE]\n\n"), tail  # json.dumps, as vLLM writes it
            ev = _events(r.text)
            assert ev[-2] == {
                "error": {
                    "message": "Simulated failure in the stream generator (stream_error_rate)",
                    "type": "BadRequestError",
                    "param": None,
                    "code": 400,
                }
            }
            assert not any((ch.get("choices") or [{}])[0].get("finish_reason") for ch in ev[:-2])
            streamed.append(len(ev) - 3)  # minus the role chunk, the error and [DONE]
        assert 10 <= failed <= 30 and len(set(streamed)) > 1, (failed, streamed)
        for seed in range(20):  # whole answers and other adapters: never
            r = await c.post("/v1/chat/completions", json=_chat(V2, seed, max_tokens=8))
            assert r.status_code == 200 and r.json()["choices"][0]["finish_reason"] == "length"
            r = await c.post("/v1/chat/completions", json={**_chat(V1, seed, max_tokens=8), "stream": True})
            assert '"error"' not in r.text


async def test_refusal_rate_and_refusal_texts(make_adapter: MakeAdapter) -> None:
    async with _sim(make_adapter, {"support@*": {"refusal_rate": 0.25}}) as (c, _):
        refused = 0
        for seed in range(N):
            r = await c.post("/v1/chat/completions", json=_chat(V1, seed, max_tokens=32))
            body = r.json()
            msg = body["choices"][0]["message"]
            if msg["content"] in REFUSALS:
                refused += 1
                assert msg["refusal"] is None  # vLLM never fills it: the refusal is the content
                assert body["choices"][0]["finish_reason"] == "stop"
                assert body["usage"]["completion_tokens"] == count_tokens(msg["content"])
        assert abs(refused / N - 0.25) < 0.05, refused
        r = await c.post("/v1/chat/completions", json=_chat(OTHER, 1, max_tokens=32))
        assert r.json()["choices"][0]["message"]["content"] not in REFUSALS
        # a short max_tokens cuts the refusal like any answer
        cut = [
            await c.post("/v1/completions", json={"model": V1, "prompt": "q", "seed": s, "max_tokens": 2})
            for s in range(40)
        ]
        short = [r.json()["choices"][0] for r in cut if r.json()["choices"][0]["text"].startswith("I")]
        assert short and all(
            ch["finish_reason"] == "length" and count_tokens(ch["text"]) == 2 for ch in short
        )


async def test_json_and_broken_json_outputs_whole_and_streamed(make_adapter: MakeAdapter) -> None:
    async with _sim(make_adapter, {V1: {"output": "json"}, V2: {"output": "broken_json"}}) as (c, _):
        for chat in (True, False):
            path = "/v1/chat/completions" if chat else "/v1/completions"
            for model in (V1, V2):
                for seed in range(20):
                    if chat:
                        body = _chat(model, seed, max_tokens=24)
                    else:
                        body = {"model": model, "prompt": "give json", "seed": seed, "max_tokens": 24}
                    r = await c.post(path, json=body)
                    ch = r.json()["choices"][0]
                    text = ch["message"]["content"] if chat else ch["text"]
                    assert r.json()["usage"]["completion_tokens"] == count_tokens(text)
                    if model == V1:
                        obj = json.loads(text)
                        assert isinstance(obj, dict) and isinstance(obj["answer"], str) and obj["answer"]
                        assert ch["finish_reason"] == "stop"
                    else:
                        assert text.startswith('{"answer": "')
                        try:
                            json.loads(text)
                        except json.JSONDecodeError:
                            pass
                        else:
                            raise AssertionError(f"broken_json parsed: {text!r}")
                    s = await c.post(path, json={**body, "stream": True})
                    assert _stream_text(_events(s.text), chat) == text  # same answer streamed
        # plain text for adapters without a behaviour
        r = await c.post("/v1/completions", json={"model": OTHER, "prompt": "give json", "max_tokens": 24})
        assert not r.json()["choices"][0]["text"].lstrip().startswith("{")


async def test_latency_factor_stretches_ttft_and_e2e(make_adapter: MakeAdapter) -> None:
    timing = TimingParams(decode_base_s=0.02, decode_per_seq_s=0.0, prefill_s_per_token=0.0, time_scale=1.0)
    async with _sim(make_adapter, {V2: {"latency_factor": 5}}, timing=timing) as (c, _):
        for model in (V1, V2):  # warm: loads are done, slots resident
            await c.post("/v1/completions", json={"model": model, "prompt": "w", "max_tokens": 1})

        async def e2e(model: str) -> float:
            t = time.monotonic()
            r = await c.post("/v1/completions", json={"model": model, "prompt": "x", "max_tokens": 5})
            assert r.status_code == 200
            return time.monotonic() - t

        async def ttft(model: str) -> float:
            t = time.monotonic()
            body = {
                "model": model,
                "messages": [{"role": "user", "content": "x"}],
                "max_tokens": 3,
                "stream": True,
            }
            async with c.stream("POST", "/v1/chat/completions", json=body) as r:
                async for line in r.aiter_lines():
                    if line.startswith("data: "):  # the role chunk comes with the first output
                        return time.monotonic() - t
            raise AssertionError("no chunk")

        fast, slow = await e2e(V1), await e2e(V2)
        # 5 engine steps of 20 ms: 0.1 s plain, stretched to >= 0.5 s
        assert fast >= 0.1 and slow >= 0.5 and slow > 2.5 * fast, (fast, slow)
        fast_t, slow_t = await ttft(V1), await ttft(V2)
        assert fast_t >= 0.02 and slow_t >= 0.1 and slow_t > fast_t, (fast_t, slow_t)
        # /metrics records what the client saw: the slow e2e alone is >= 0.5 s of the sum
        fams = {f.name: f for f in text_string_to_metric_families((await c.get("/metrics")).text)}
        e2e_sums = {s.name: s.value for s in fams["vllm:e2e_request_latency_seconds"].samples}
        ttft_sums = {s.name: s.value for s in fams["vllm:time_to_first_token_seconds"].samples}
        assert e2e_sums["vllm:e2e_request_latency_seconds_sum"] >= 0.5 + 0.1
        assert ttft_sums["vllm:time_to_first_token_seconds_sum"] >= 0.1 + 0.02


async def test_runtime_control_flips_a_version_and_rejects_bad_sets_whole(make_adapter: MakeAdapter) -> None:
    async with _sim(make_adapter, {}) as (c, app):
        body = {"model": V2, "prompt": "x", "max_tokens": 2}

        async def statuses(model: str) -> set[int]:
            got = set()
            for s in range(10):
                got.add(
                    (await c.post("/v1/completions", json={**body, "model": model, "seed": s})).status_code
                )
            return got

        assert await statuses(V2) == {200}
        r = await c.post("/_sim/faults", json={"behaviours": {"support@v2-*": {"error_rate": 1}}})
        assert r.status_code == 200
        assert r.json()["behaviours"] == {
            "support@v2-*": {
                "error_rate": 1.0, "latency_factor": 1.0, "refusal_rate": 0.0, "output": "text",
                "stream_error_rate": 0.0,
            }
        }  # fmt: skip
        assert await statuses(V2) == {500}
        assert (await c.post("/v1/completions", json={**body, "model": V1})).status_code == 200
        # a bad set is refused with every problem, and nothing in that body is applied
        bad = {"stall_s": 3, "behaviours": {"support@v1-[": {"error_rate": -1, "colour": "red"}}}
        r = await c.post("/_sim/faults", json=bad)
        assert r.status_code == 400
        problems = r.json()["problems"]
        assert len(problems) == 3 and any("never closed" in p for p in problems)
        assert any("error_rate" in p for p in problems) and any("colour" in p for p in problems)
        state = (await c.get("/_sim/faults")).json()
        assert state["stall_s"] == 0 and list(state["behaviours"]) == ["support@v2-*"]
        # healthy again: clear the set (reset clears it too)
        assert (await c.post("/_sim/faults", json={"behaviours": None})).json()["behaviours"] == {}
        assert (await c.post("/v1/completions", json={**body, "seed": 1})).status_code == 200
        await c.post("/_sim/faults", json={"behaviours": {V2: {"error_rate": 1}}})
        assert (await c.post("/_sim/faults", json={"reset": True})).json()["behaviours"] == {}
        assert app.config.faults.behaviours.lookup(V2) is None
