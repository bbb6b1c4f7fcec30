"""The checks of ``simulator.conformance`` (each true of real vLLM 0.32/0.33 and the simulator)."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import httpx

METRIC_NAMES = (
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
    "vllm:kv_cache_usage_perc",
    "vllm:prompt_tokens_total",
    "vllm:generation_tokens_total",
    "vllm:request_success_total",
    "vllm:time_to_first_token_seconds_bucket",
    "vllm:inter_token_latency_seconds_bucket",
    "vllm:e2e_request_latency_seconds_bucket",
    "vllm:request_queue_time_seconds_bucket",
)


@dataclass
class Check:
    name: str
    ok: bool
    detail: str = ""


@dataclass
class Report:
    url: str
    checks: list[Check] = field(default_factory=list)

    @property
    def passed(self) -> int:
        return sum(c.ok for c in self.checks)

    @property
    def failed(self) -> list[Check]:
        return [c for c in self.checks if not c.ok]

    def as_dict(self) -> dict[str, Any]:
        return {
            "url": self.url,
            "passed": self.passed,
            "failed": len(self.failed),
            "checks": [asdict(c) for c in self.checks],
        }


class Runner:
    def __init__(self, client: httpx.Client, report: Report) -> None:
        self.c = client
        self.report = report

    def check(self, name: str, fn: Callable[[], tuple[bool, str] | bool]) -> bool:
        try:
            out = fn()
            ok, detail = out if isinstance(out, tuple) else (out, "")
        except Exception as exc:  # a check that crashes is a failed check, with the reason
            ok, detail = False, f"{type(exc).__name__}: {exc}"
        self.report.checks.append(Check(name, bool(ok), detail))
        return bool(ok)


def _err(r: httpx.Response) -> dict[str, Any]:
    body = r.json()
    e = body["error"]
    assert set(e) >= {"message", "type", "param", "code"}, body
    assert e["code"] == r.status_code, body
    return e  # type: ignore[no-any-return]


def _sse_events(r: httpx.Response) -> list[Any]:
    text = r.text
    blocks = [b for b in text.split("\n\n") if b.strip()]
    events: list[Any] = []
    for b in blocks:
        lines = [ln for ln in b.split("\n") if not ln.startswith(":")]  # keep-alive comments
        if not lines:
            continue
        assert len(lines) == 1 and lines[0].startswith("data: "), b
        payload = lines[0][len("data: ") :]
        events.append(payload if payload == "[DONE]" else json.loads(payload))
    return events


def _metric_samples(text: str) -> list[tuple[str, dict[str, str], float]]:
    from prometheus_client.parser import text_string_to_metric_families

    out = []
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out.append((s.name, dict(s.labels), float(s.value)))
    return out


def probes(run: Runner, c: httpx.Client, url: str, model: str, api_key: str | None) -> None:
    def health() -> tuple[bool, str]:
        r = httpx.get(f"{url}/health", timeout=10)
        return r.status_code == 200 and r.content == b"", f"{r.status_code} {r.content[:80]!r}"

    run.check("health: GET /health is 200 with an empty body (no key needed)", health)
    run.check("health: GET /ping is 200", lambda: httpx.get(f"{url}/ping", timeout=10).status_code == 200)

    def version() -> tuple[bool, str]:
        body = httpx.get(f"{url}/version", timeout=10).json()
        return isinstance(body.get("version"), str), str(body)

    run.check("health: GET /version is {'version': str}", version)

    def load_endpoint() -> tuple[bool, str]:
        body = httpx.get(f"{url}/load", timeout=10).json()
        return isinstance(body.get("server_load"), int), str(body)

    run.check("health: GET /load is {'server_load': int}", load_endpoint)
    if api_key:

        def unauthorized() -> tuple[bool, str]:
            r = httpx.get(f"{url}/v1/models", timeout=10)
            return r.status_code == 401 and r.json() == {
                "error": "Unauthorized"
            }, f"{r.status_code} {r.text[:100]}"

        run.check("auth: /v1/models without the key is 401 {'error': 'Unauthorized'}", unauthorized)
        run.check(
            "auth: /metrics stays open without the key",
            lambda: httpx.get(f"{url}/metrics", timeout=10).status_code == 200,
        )

    def models_base() -> tuple[bool, str]:
        body = c.get("/v1/models").json()
        base = body["data"][0]
        perm = base["permission"][0]["id"]
        ok = (
            body["object"] == "list"
            and base["id"] == model
            and base["object"] == "model"
            and base["owned_by"] == "vllm"
            and base["parent"] is None
            and isinstance(base["max_model_len"], int)
            and isinstance(base["created"], int)
            and perm.startswith("modelperm-")
        )
        return ok, json.dumps(base)[:300]

    run.check("models: base card first (parent null, max_model_len int, modelperm id)", models_base)


def lora_lifecycle(
    run: Runner, c: httpx.Client, model: str, name: str, adapter_dir: str, bad_dir: str
) -> None:
    def get_405() -> tuple[bool, str]:
        r = c.get("/v1/load_lora_adapter")
        return r.status_code == 405 and r.json() == {
            "detail": "Method Not Allowed"
        }, f"{r.status_code} {r.text}"

    run.check("load: GET on the load route is 405 {'detail': 'Method Not Allowed'}", get_405)

    def load_ok() -> tuple[bool, str]:
        r = c.post("/v1/load_lora_adapter", json={"lora_name": name, "lora_path": adapter_dir})
        ok = (
            r.status_code == 200
            and r.text == f"Success: LoRA adapter '{name}' added successfully."
            and "content-type" not in r.headers
        )
        return ok, f"{r.status_code} {r.text[:200]} ct={r.headers.get('content-type')}"

    run.check("load: 200, exact plain-text success body, no Content-Type", load_ok)

    def card() -> tuple[bool, str]:
        data = c.get("/v1/models").json()["data"]
        ids = [m["id"] for m in data]
        lora = next(m for m in data if m["id"] == name)
        ok = (
            ids.index(name) > ids.index(model)
            and lora["parent"] == model
            and lora["root"] == adapter_dir
            and lora["max_model_len"] is None
        )
        return ok, json.dumps(lora)[:300]

    run.check("models: LoRA card after the base (parent=base, root=lora_path, max_model_len null)", card)

    def again() -> tuple[bool, str]:
        r = c.post("/v1/load_lora_adapter", json={"lora_name": name, "lora_path": adapter_dir})
        e = _err(r)
        ok = r.status_code == 400 and e["type"] == "InvalidUserInput"
        ok = ok and e["message"].startswith(f"The lora adapter '{name}' has already been loaded.")
        return ok, f"{r.status_code} {e}"

    run.check("load: a repeat name is 400 InvalidUserInput 'has already been loaded'", again)

    def inplace() -> tuple[bool, str]:
        body = {"lora_name": name, "lora_path": adapter_dir, "load_inplace": True}
        r = c.post("/v1/load_lora_adapter", json=body)
        return r.status_code == 200, f"{r.status_code} {r.text[:200]}"

    run.check("load: load_inplace=true on a loaded name is 200", inplace)

    def missing_field() -> tuple[bool, str]:
        r = c.post("/v1/load_lora_adapter", json={"lora_name": name})
        e = _err(r)
        ok = r.status_code == 400 and e["type"] == "Bad Request" and "lora_path" in e["message"]
        return ok, f"{r.status_code} {e}"

    run.check("load: a missing lora_path is 400 'Bad Request' (validation error)", missing_field)

    def empty() -> tuple[bool, str]:
        r = c.post("/v1/load_lora_adapter", json={"lora_name": "", "lora_path": adapter_dir})
        e = _err(r)
        ok = r.status_code == 400 and e["type"] == "InvalidUserInput"
        ok = ok and e["message"] == "Both 'lora_name' and 'lora_path' must be provided."
        return ok, f"{r.status_code} {e}"

    run.check("load: an empty name is 400 InvalidUserInput 'Both ... must be provided.'", empty)

    def conflict() -> tuple[bool, str]:
        r = c.post("/v1/load_lora_adapter", json={"lora_name": model, "lora_path": adapter_dir})
        e = _err(r)
        ok = (
            r.status_code == 400
            and e["type"] == "InvalidUserInput"
            and "conflicts with a served base model" in (e["message"])
        )
        return ok, f"{r.status_code} {e}"

    run.check("load: the base name is 400 InvalidUserInput 'conflicts with a served base model'", conflict)

    def media() -> tuple[bool, str]:
        r = c.post("/v1/load_lora_adapter", content=b"x", headers={"content-type": "text/plain"})
        e = _err(r)
        ok = r.status_code == 400 and e["type"] == "Bad Request" and "Unsupported Media Type" in e["message"]
        return ok, f"{r.status_code} {e}"

    run.check("load: a non-JSON content type is 400 'Unsupported Media Type'", media)

    def not_found() -> tuple[bool, str]:
        missing = os.path.join(adapter_dir, "does-not-exist")
        r = c.post("/v1/load_lora_adapter", json={"lora_name": f"{name}-nf", "lora_path": missing})
        e = _err(r)
        ok = r.status_code == 404 and e["type"] == "NotFoundError"
        ok = (
            ok
            and e["message"].startswith(f"Loading lora {name}-nf failed: ")
            and "No adapter found" in e["message"]
        )
        return ok, f"{r.status_code} {e}"

    run.check("load: a path without adapter_config.json is 404 NotFoundError 'No adapter found'", not_found)

    def bad_rank() -> tuple[bool, str]:
        r = c.post("/v1/load_lora_adapter", json={"lora_name": f"{name}-rank", "lora_path": bad_dir})
        e = _err(r)
        ok = r.status_code == 500 and e["type"] == "InternalServerError"
        ok = (
            ok
            and e["message"].startswith("Call to add_lora method failed: ")
            and "max_lora_rank" in e["message"]
        )
        return ok, f"{r.status_code} {e}"

    run.check("load: rank over --max-lora-rank is 500 'Call to add_lora method failed: ...'", bad_rank)
    run.check("health: still 200 after a failed load", lambda: c.get("/health").status_code == 200)


def generation(run: Runner, c: httpx.Client, model: str, name: str) -> None:
    prompt = "Hello there, how are you today"

    def completion() -> tuple[bool, str]:
        r = c.post(
            "/v1/completions", json={"model": name, "prompt": prompt, "max_tokens": 5, "ignore_eos": True}
        )
        b = r.json()
        u = b["usage"]
        ok = (
            r.status_code == 200
            and b["id"].startswith("cmpl-")
            and b["object"] == "text_completion"
            and b["model"] == name
            and isinstance(b["choices"][0]["text"], str)
            and b["choices"][0]["finish_reason"] == "length"
            and u["completion_tokens"] == 5
            and u["total_tokens"] == u["prompt_tokens"] + 5
        )
        return ok, json.dumps(b)[:300]

    run.check("completions: 200, cmpl- id, model echoes the LoRA name, usage adds up", completion)

    def chat() -> tuple[bool, str]:
        body = {
            "model": name,
            "messages": [{"role": "user", "content": prompt}],
            "max_tokens": 4,
            "ignore_eos": True,
        }
        r = c.post("/v1/chat/completions", json=body)
        b = r.json()
        ok = (
            r.status_code == 200
            and b["id"].startswith("chatcmpl-")
            and b["object"] == "chat.completion"
            and b["model"] == name
            and b["choices"][0]["message"]["role"] == "assistant"
            and b["usage"]["completion_tokens"] == 4
        )
        return ok, json.dumps(b)[:300]

    run.check("chat: 200, chatcmpl- id, assistant message, model echo", chat)

    def base_default() -> tuple[bool, str]:
        r = c.post("/v1/completions", json={"prompt": prompt, "max_tokens": 2})
        return r.status_code == 200 and r.json()["model"] == model, r.text[:200]

    run.check("routing: a missing model is served by the base model", base_default)

    def unknown() -> tuple[bool, str]:
        r = c.post("/v1/completions", json={"model": "nosuch-conformance", "prompt": prompt})
        e = _err(r)
        ok = r.status_code == 404 and e["type"] == "NotFoundError" and e["param"] == "model"
        ok = ok and e["message"].startswith("The model `nosuch-conformance` does not exist.")
        return ok, f"{r.status_code} {e}"

    run.check("routing: an unknown model is 404 NotFoundError, param 'model'", unknown)

    def unknown_stream() -> tuple[bool, str]:
        body = {"model": "nosuch-conformance", "messages": [{"role": "user", "content": "x"}], "stream": True}
        r = c.post("/v1/chat/completions", json=body)
        ok = r.status_code == 404 and r.headers.get("content-type", "").startswith("application/json")
        return ok and _err(r)["type"] == "NotFoundError", f"{r.status_code} {r.headers.get('content-type')}"

    run.check("routing: an unknown model with stream=true is a 404 JSON body, not SSE", unknown_stream)

    def opts_without_stream() -> tuple[bool, str]:
        body = {"model": model, "prompt": prompt, "stream_options": {"include_usage": True}}
        r = c.post("/v1/completions", json=body)
        e = _err(r)
        ok = r.status_code == 400 and e["type"] == "BadRequestError" and e["param"] == "stream_options"
        return ok, f"{r.status_code} {e}"

    run.check("streaming: stream_options without stream is 400 BadRequestError", opts_without_stream)

    def chat_stream() -> tuple[bool, str]:
        body = {
            "model": name,
            "messages": [{"role": "user", "content": prompt}],
            "max_tokens": 3,
            "ignore_eos": True,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        r = c.post("/v1/chat/completions", json=body)
        ev = _sse_events(r)
        chunks = [e for e in ev if isinstance(e, dict)]
        first, usage = chunks[0], chunks[-1]
        finishes = [e for e in chunks if e["choices"] and e["choices"][0].get("finish_reason")]
        ok = (
            r.status_code == 200
            and r.headers["content-type"].startswith("text/event-stream")
            and ev[-1] == "[DONE]"
            and first["choices"][0]["delta"].get("role") == "assistant"
            and len(finishes) == 1
            and finishes[0]["choices"][0]["finish_reason"] == "length"
            and usage["choices"] == []
            and usage["usage"]["completion_tokens"] == 3
            and len({e["id"] for e in chunks}) == 1
            and chunks[0]["id"].startswith("chatcmpl-")
            and all(e["object"] == "chat.completion.chunk" and e["model"] == name for e in chunks)
        )
        return ok, r.text[:400]

    run.check("streaming: chat SSE = role chunk, content, finish chunk, usage chunk, [DONE]", chat_stream)

    def completion_stream() -> tuple[bool, str]:
        body = {"model": model, "prompt": prompt, "max_tokens": 3, "stream": True}
        r = c.post("/v1/completions", json=body)
        ev = _sse_events(r)
        chunks = [e for e in ev if isinstance(e, dict)]
        ok = (
            ev[-1] == "[DONE]"
            and all(e["choices"] for e in chunks)  # no usage chunk unless asked
            and all(e["object"] == "text_completion" and e["id"].startswith("cmpl-") for e in chunks)
        )
        return ok, r.text[:300]

    run.check("streaming: completions SSE without usage has no usage chunk, ends [DONE]", completion_stream)

    def tokenize() -> tuple[bool, str]:
        r = c.post("/tokenize", json={"model": model, "prompt": prompt})
        b = r.json()
        ok = r.status_code == 200 and b["count"] == len(b["tokens"]) and isinstance(b["max_model_len"], int)
        return ok, r.text[:200]

    run.check("tokenize: {'count', 'max_model_len', 'tokens'}", tokenize)


def metrics(run: Runner, c: httpx.Client, model: str) -> None:
    r = c.get("/metrics")
    samples = _metric_samples(r.text) if r.status_code == 200 else []
    names = {s[0] for s in samples}

    def names_present() -> tuple[bool, str]:
        missing = [n for n in METRIC_NAMES if n not in names]
        return not missing and r.headers["content-type"].startswith("text/plain"), f"missing {missing}"

    run.check("metrics: vLLM's metric names present, text/plain", names_present)

    def labels() -> tuple[bool, str]:
        bad = [
            (n, lab)
            for n, lab, _ in samples
            if n in METRIC_NAMES and (lab.get("model_name") != model or lab.get("engine") != "0")
        ]
        return not bad, str(bad[:3])

    run.check("metrics: model_name = base name and engine='0' on engine metrics", labels)

    def lora_info() -> tuple[bool, str]:
        info = [(lab, v) for n, lab, v in samples if n == "vllm:lora_requests_info"]
        if not info:
            return False, "no vllm:lora_requests_info sample after LoRA traffic"
        ok = all(
            set(lab) == {"max_lora", "running_lora_adapters", "waiting_lora_adapters"}
            and lab["running_lora_adapters"] == lab["waiting_lora_adapters"]
            and v > 1e9
            for lab, v in info
        )
        return ok, str(info[:3])

    run.check("metrics: lora_requests_info labels, same set in both, value = Unix time", lora_info)


def unload(run: Runner, c: httpx.Client, model: str, name: str) -> None:
    def unload() -> tuple[bool, str]:
        r = c.post("/v1/unload_lora_adapter", json={"lora_name": name})
        ok = (
            r.status_code == 200
            and r.text == f"Success: LoRA adapter '{name}' removed successfully."
            and "content-type" not in r.headers
        )
        return ok, f"{r.status_code} {r.text[:200]}"

    run.check("unload: 200, exact plain-text success body, no Content-Type", unload)
    run.check(
        "unload: the card vanishes from /v1/models",
        lambda: name not in [m["id"] for m in c.get("/v1/models").json()["data"]],
    )

    def again() -> tuple[bool, str]:
        r = c.post("/v1/unload_lora_adapter", json={"lora_name": name})
        e = _err(r)
        ok = r.status_code == 404 and e["type"] == "NotFoundError"
        ok = ok and e["message"] == f"The lora adapter '{name}' cannot be found."
        return ok, f"{r.status_code} {e}"

    run.check("unload: an unknown name is 404 NotFoundError 'cannot be found.'", again)

    def gone() -> tuple[bool, str]:
        r = c.post("/v1/completions", json={"model": name, "prompt": "x", "max_tokens": 1})
        return r.status_code == 404, str(r.status_code)

    run.check("unload: requests for the unloaded name are 404", gone)

    def empty() -> tuple[bool, str]:
        r = c.post("/v1/unload_lora_adapter", json={"lora_name": ""})
        e = _err(r)
        return r.status_code == 400 and e["type"] == "InvalidUserInput", f"{r.status_code} {e}"

    run.check("unload: an empty name is 400 InvalidUserInput", empty)
