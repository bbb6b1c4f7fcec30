"""HTTP surface of the simulator in process: models, routing, generation, SSE, auth, metrics."""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Callable

import orjson
from prometheus_client.parser import text_string_to_metric_families

from simulator.config import SimConfig
from simulator.engine import TimingParams
from simulator.textgen import count_tokens
from tests.simulator.simutil import load, sim_client

MakeAdapter = Callable[..., str]


def _sse(text: str) -> list[dict | str]:
    assert text.endswith("data: [DONE]\n\n")
    events: list[dict | str] = []
    for block in text.split("\n\n")[:-1]:
        assert block.startswith("data: "), block
        payload = block[len("data: ") :]
        events.append(payload if payload == "[DONE]" else orjson.loads(payload))
    return events


async def test_models_cards(make_adapter: MakeAdapter) -> None:
    pa, pb = make_adapter("a"), make_adapter("b", seed=2)
    async with sim_client(model="tinybase", max_model_len=256) as (c, _):
        await load(c, "zeta", pa)
        await load(c, "alpha", pb)
        before = int(time.time())
        body = (await c.get("/v1/models")).json()
        assert body["object"] == "list"
        data = body["data"]
        assert [m["id"] for m in data] == ["tinybase", "zeta", "alpha"]  # base first, then load order
        base, lora = data[0], data[1]
        assert base["parent"] is None and base["max_model_len"] == 256 and base["root"] == "tinybase"
        assert lora["parent"] == "tinybase" and lora["root"] == pa and lora["max_model_len"] is None
        assert lora["object"] == "model" and lora["owned_by"] == "vllm"
        assert lora["created"] >= before
        perm = lora["permission"][0]
        assert re.fullmatch(r"modelperm-[0-9a-f]{16}", perm["id"])
        again = (await c.get("/v1/models")).json()["data"]
        assert again[1]["permission"][0]["id"] != perm["id"]  # random per call


async def test_routing_unknown_missing_and_echo(make_adapter: MakeAdapter) -> None:
    async with sim_client(model="tinybase") as (c, _):
        await load(c, "static1", make_adapter())
        r = await c.post("/v1/completions", json={"model": "nosuch", "prompt": "x"})
        assert r.status_code == 404
        assert r.json() == {
            "error": {
                "message": "The model `nosuch` does not exist. Valid aliases: tinybase.",
                "type": "NotFoundError",
                "param": "model",
                "code": 404,
            }
        }
        r = await c.post("/v1/chat/completions", json={"model": "nosuch", "messages": [], "stream": True})
        assert r.status_code == 404 and r.headers["content-type"] == "application/json"  # JSON, not SSE
        r = await c.post("/v1/completions", json={"prompt": "x"})
        assert r.status_code == 200 and r.json()["model"] == "tinybase"
        r = await c.post(
            "/v1/chat/completions", json={"model": "static1", "messages": [{"role": "user", "content": "x"}]}
        )
        assert r.status_code == 200 and r.json()["model"] == "static1"


async def test_completion_and_chat_shapes() -> None:
    async with sim_client() as (c, _):
        r = await c.post(
            "/v1/completions", json={"model": "demo-base", "prompt": "one two three", "max_tokens": 7}
        )
        body = r.json()
        assert r.headers["content-type"] == "application/json"
        assert re.fullmatch(r"cmpl-[0-9a-f]+", body["id"]) and body["object"] == "text_completion"
        ch = body["choices"][0]
        assert ch["index"] == 0 and ch["finish_reason"] == "length" and ch["logprobs"] is None
        assert body["usage"] == {"prompt_tokens": 3, "total_tokens": 10, "completion_tokens": 7,
                                 "prompt_tokens_details": None,
                                 "completion_tokens_details": None}  # fmt: skip
        assert count_tokens(ch["text"]) == 7
        assert body["system_fingerprint"].startswith("vllm-0.33.0-")
        r = await c.post(
            "/v1/chat/completions",
            json={"messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 4, "n": 2,
                  "temperature": 0.7, "logprobs": None, "seed": 3},
        )  # fmt: skip
        body = r.json()
        assert re.fullmatch(r"chatcmpl-[0-9a-f]+", body["id"]) and body["object"] == "chat.completion"
        assert [ch["index"] for ch in body["choices"]] == [0, 1]
        msg = body["choices"][0]["message"]
        assert msg["role"] == "assistant" and count_tokens(msg["content"]) == 4
        assert body["usage"]["completion_tokens"] == 8


async def test_stop_strings_and_validation() -> None:
    async with sim_client() as (c, _):
        full = (await c.post("/v1/completions", json={"prompt": "p", "max_tokens": 16})).json()["choices"][0][
            "text"
        ]
        words = full.split()
        stop = words[3]
        body = (
            await c.post("/v1/completions", json={"prompt": "p", "max_tokens": 16, "stop": [stop]})
        ).json()
        ch = body["choices"][0]
        assert ch["finish_reason"] == "stop" and ch["stop_reason"] == stop
        assert stop not in ch["text"].split()[3:] and full.startswith(ch["text"])
        assert body["usage"]["completion_tokens"] <= 16
        r = await c.post("/v1/completions", json={"prompt": "p", "stream_options": {"include_usage": True}})
        assert r.status_code == 400 and r.json() == {
            "error": {
                "message": "Stream options can only be defined when `stream=True`. "
                "(parameter=stream_options)",
                "type": "BadRequestError",
                "param": "stream_options",
                "code": 400,
            }
        }
        r = await c.post("/v1/completions", json={"model": "demo-base"})
        assert r.status_code == 400 and r.json()["error"]["param"] == "body.prompt"
        r = await c.post("/v1/completions", json={"prompt": "p", "max_tokens": 0})
        assert r.status_code == 400
        r = await c.post("/v1/completions", json={"prompt": "p", "max_tokens": 100000})
        assert r.status_code == 400 and "maximum context length" in r.json()["error"]["message"]
        r = await c.post("/v1/completions", content=b"x", headers={"content-type": "text/plain"})
        assert r.status_code == 400 and "Unsupported Media Type" in r.json()["error"]["message"]


async def test_chat_stream_sse_framing(make_adapter: MakeAdapter) -> None:
    async with sim_client() as (c, _):
        await load(c, "static1", make_adapter())
        r = await c.post(
            "/v1/chat/completions",
            json={"model": "static1", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 3,
                  "stream": True, "stream_options": {"include_usage": True}},
        )  # fmt: skip
        assert r.status_code == 200
        assert r.headers["content-type"] == "text/event-stream; charset=utf-8"
        ev = _sse(r.text)
        assert ev[-1] == "[DONE]"
        role, *content, finish, usage, _ = ev
        assert isinstance(role, dict) and role["choices"][0]["delta"] == {"role": "assistant", "content": ""}
        assert len(content) == 3 and all(
            isinstance(x, dict) and x["choices"][0]["finish_reason"] is None for x in content
        )
        assert isinstance(finish, dict) and finish["choices"][0]["finish_reason"] == "length"
        assert finish["choices"][0]["delta"] == {"content": ""}
        assert isinstance(usage, dict) and usage["choices"] == []
        assert usage["usage"]["completion_tokens"] == 3 and "system_fingerprint" in usage
        ids = {x["id"] for x in ev if isinstance(x, dict)}
        assert len(ids) == 1 and next(iter(ids)).startswith("chatcmpl-")
        assert all(
            x["object"] == "chat.completion.chunk" and x["model"] == "static1"
            for x in ev
            if isinstance(x, dict)
        )
        text = "".join(x["choices"][0]["delta"]["content"] for x in content if isinstance(x, dict))
        unary = await c.post(
            "/v1/chat/completions",
            json={"model": "static1", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 3},
        )
        assert unary.json()["choices"][0]["message"]["content"] == text  # same text streamed or not


async def test_completion_stream_without_usage() -> None:
    async with sim_client() as (c, _):
        r = await c.post("/v1/completions", json={"prompt": "abc", "max_tokens": 2, "stream": True})
        ev = _sse(r.text)
        dicts = [x for x in ev if isinstance(x, dict)]
        assert all(x["object"] == "text_completion" and x["id"].startswith("cmpl-") for x in dicts)
        assert all(x["choices"] for x in dicts)  # no usage chunk unless asked
        assert dicts[-1]["choices"][0]["finish_reason"] == "length"
        assert len(dicts) == 3


async def test_determinism_by_adapter_bytes(make_adapter: MakeAdapter) -> None:
    same1, same2 = make_adapter("s1", seed=7), make_adapter("s2", seed=7)
    other = make_adapter("o", seed=8)
    async with sim_client() as (c, _):
        for name, path in (("first", same1), ("second", same2), ("third", other)):
            assert (await load(c, name, path)).status_code == 200

        async def text(model: str, seed: int = 0, prompt: str = "the prompt") -> str:
            r = await c.post("/v1/completions", json={"model": model, "prompt": prompt, "seed": seed})
            return str(r.json()["choices"][0]["text"])

        assert await text("first") == await text("second")  # same bytes, different names
        assert await text("first") != await text("third")  # different adapter
        assert await text("first") != await text("demo-base")
        assert await text("first", seed=1) != await text("first", seed=0)
        assert await text("first", prompt="other") != await text("first")
        assert await text("first") == await text("first")


async def test_api_key_guards_v1_only() -> None:
    async with sim_client(api_key="sekret") as (c, _):
        for method, path in (("GET", "/v1/models"), ("POST", "/v1/completions"), ("POST", "/v1/nosuch")):
            r = await c.request(method, path, json={})
            assert r.status_code == 401 and r.json() == {"error": "Unauthorized"}
        r = await c.get("/v1/models", headers={"Authorization": "Bearer wrong"})
        assert r.status_code == 401
        assert (await c.get("/v1/models", headers={"Authorization": "Bearer sekret"})).status_code == 200
        for path in ("/health", "/metrics", "/version", "/load", "/ping"):
            assert (await c.get(path)).status_code == 200, path


async def test_health_ping_version_load_tokenize() -> None:
    async with sim_client(enable_server_load_tracking=True) as (c, app):
        r = await c.get("/health")
        assert r.status_code == 200 and r.content == b""
        assert (await c.post("/ping")).status_code == 200
        assert (await c.get("/version")).json() == {"version": "0.33.0"}
        assert (await c.get("/load")).json() == {"server_load": 0}
        r = await c.post("/tokenize", json={"model": "demo-base", "prompt": "Hello, world!"})
        body = r.json()
        assert body["count"] == 4 and len(body["tokens"]) == 4 and body["max_model_len"] == 8192
        assert (await c.get("/nosuch")).json() == {"detail": "Not Found"}
        app.config.faults.dead = True
        assert (await c.get("/health")).status_code == 503
        assert (await c.get("/ping")).status_code == 503


def _samples(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out.setdefault(s.name, []).append((dict(s.labels), s.value))
    return out


async def test_metrics_names_labels_and_counters() -> None:
    async with sim_client(model="tinybase") as (c, _):
        await c.post("/v1/completions", json={"prompt": "a b c", "max_tokens": 5})
        r = await c.get("/metrics")
        assert r.headers["content-type"].startswith("text/plain; version=")
        s = _samples(r.text)
        for name in (
            "vllm:num_requests_running",
            "vllm:num_requests_waiting",
            "vllm:num_requests_waiting_by_reason",
            "vllm:kv_cache_usage_perc",
            "vllm:prompt_tokens_total",
            "vllm:generation_tokens_total",
            "vllm:request_success_total",
            "vllm:time_to_first_token_seconds_bucket",
            "vllm:inter_token_latency_seconds_count",
            "vllm:e2e_request_latency_seconds_sum",
            "vllm:request_queue_time_seconds_count",
        ):
            assert name in s, name
            for labels, _ in s[name]:
                assert labels["model_name"] == "tinybase" and labels["engine"] == "0"
        assert s["vllm:prompt_tokens_total"][0][1] == 3
        assert s["vllm:generation_tokens_total"][0][1] == 5
        ok = {lab["finished_reason"]: v for lab, v in s["vllm:request_success_total"]}
        assert ok["length"] == 1
        assert s["vllm:inter_token_latency_seconds_count"][0][1] == 4
        assert {lab["reason"] for lab, _ in s["vllm:num_requests_waiting_by_reason"]} == {
            "capacity",
            "deferred",
        }


async def test_scheduling_and_lora_info_in_scaled_timing(make_adapter: MakeAdapter) -> None:
    """max_loras=1, 2×A + 2×B + 1 base → running 3, waiting 2 (deferred 2); B absent from lora info."""
    timing = TimingParams.zero(decode_base_s=0.4, max_loras=1, max_cpu_loras=2)
    async with sim_client(SimConfig(timing=timing)) as (c, app):
        await load(c, "A", make_adapter("A", seed=1))
        await load(c, "B", make_adapter("B", seed=2))
        done: list[str] = []

        async def ask(model: str) -> float:
            t0 = time.monotonic()
            r = await c.post("/v1/completions", json={"model": model, "prompt": "x", "max_tokens": 6})
            assert r.status_code == 200
            done.append(model)
            return time.monotonic() - t0

        tasks = [asyncio.create_task(ask(m)) for m in ("A", "A", "B", "B", "demo-base")]
        for _ in range(500):  # cheap poll (the machine may be busy) until A+A+base run, then scrape
            await asyncio.sleep(0.01)
            if app.engine.running == 3:
                break
        s = _samples((await c.get("/metrics")).text)
        assert s["vllm:num_requests_running"][0][1] == 3
        assert s["vllm:num_requests_waiting"][0][1] == 2
        by_reason = {lab["reason"]: v for lab, v in s["vllm:num_requests_waiting_by_reason"]}
        assert by_reason == {"capacity": 0, "deferred": 2}
        info = s["vllm:lora_requests_info"]
        latest = max(info, key=lambda x: x[1])
        assert latest[0] == {"max_lora": "1", "running_lora_adapters": "A", "waiting_lora_adapters": "A"}
        assert abs(latest[1] - time.time()) < 5  # value is a Unix time
        took = await asyncio.gather(*tasks)
        assert done.index("B") > max(i for i, m in enumerate(done) if m == "A")  # no preemption
        assert min(took[2:4]) >= 4.7  # 6 steps waiting for A + 6 own steps of 400 ms
        s = _samples((await c.get("/metrics")).text)
        info = s["vllm:lora_requests_info"]
        label_sets = {(lab["running_lora_adapters"], lab["waiting_lora_adapters"]) for lab, _ in info}
        assert ("A", "A") in label_sets and ("B", "B") in label_sets  # stale label sets are kept
        assert max(info, key=lambda x: x[1])[0]["running_lora_adapters"] == ""
        ttft = s["vllm:time_to_first_token_seconds_sum"][0][1]
        assert ttft > 0.2  # the deferred requests waited
