"""Direct tests of a real vLLM 0.32 replica: they document its behaviour for the simulator and router.

Each test uses its own adapter names, so tests share the two session replicas safely.
"""

from __future__ import annotations

import json
import uuid

import httpx
import pytest

from tests.engine import vllm_env as ve
from tests.engine.conftest import ENGINE_MARKS, EngineAdapters

pytestmark = ENGINE_MARKS

BASE = ve.SERVED_NAME
PROMPT = "the quick brown fox jumps over"


def _name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


def load(client: httpx.Client, name: str, path: object, **extra: object) -> httpx.Response:
    return client.post("/v1/load_lora_adapter", json={"lora_name": name, "lora_path": str(path), **extra})


def unload(client: httpx.Client, name: str) -> httpx.Response:
    return client.post("/v1/unload_lora_adapter", json={"lora_name": name})


def greedy(client: httpx.Client, model: str, prompt: str = PROMPT, n: int = 12) -> dict[str, object]:
    r = client.post(
        "/v1/completions",
        json={"model": model, "prompt": prompt, "max_tokens": n, "temperature": 0, "ignore_eos": True},
    )
    assert r.status_code == 200, r.text
    body: dict[str, object] = r.json()
    return body


def _text(body: dict[str, object]) -> str:
    choices = body["choices"]
    assert isinstance(choices, list)
    return str(choices[0]["text"])


def test_health_version_and_models_card(vllm_client: httpx.Client) -> None:
    h = vllm_client.get("/health")
    assert h.status_code == 200 and h.content == b""
    assert vllm_client.get("/version").json() == {"version": ve.VLLM_VERSION}
    models = vllm_client.get("/v1/models").json()
    assert models["object"] == "list"
    base = models["data"][0]
    assert base["id"] == BASE and base["object"] == "model" and base["owned_by"] == "vllm"
    assert base["parent"] is None and base["max_model_len"] == ve.MAX_MODEL_LEN
    assert base["root"].endswith("tiny-llama")
    perm = base["permission"][0]
    assert perm["object"] == "model_permission" and perm["id"].startswith("modelperm-")


def test_load_unload_success_strings_and_lora_card(
    vllm_client: httpx.Client, engine_adapters: EngineAdapters
) -> None:
    name = _name("ok")
    r = load(vllm_client, name, engine_adapters.a1)
    assert r.status_code == 200
    assert r.text == f"Success: LoRA adapter '{name}' added successfully."
    assert "content-type" not in r.headers
    cards = {c["id"]: c for c in vllm_client.get("/v1/models").json()["data"]}
    card = cards[name]
    assert card["parent"] == BASE and card["root"] == str(engine_adapters.a1)
    assert card["max_model_len"] is None
    ids = [c["id"] for c in vllm_client.get("/v1/models").json()["data"]]
    assert ids[0] == BASE  # base card first, LoRAs after
    r = unload(vllm_client, name)
    assert r.status_code == 200
    assert r.text == f"Success: LoRA adapter '{name}' removed successfully."
    assert "content-type" not in r.headers
    assert name not in {c["id"] for c in vllm_client.get("/v1/models").json()["data"]}


def test_error_table_rows(vllm_client: httpx.Client, engine_adapters: EngineAdapters) -> None:
    name = _name("dup")
    assert load(vllm_client, name, engine_adapters.a1).status_code == 200
    dup = load(vllm_client, name, engine_adapters.a1)
    assert dup.status_code == 400
    assert dup.json() == {
        "error": {
            "message": f"The lora adapter '{name}' has already been loaded. If you want to load the "
            "adapter in place, set 'load_inplace' to True.",
            "type": "InvalidUserInput",
            "param": None,
            "code": 400,
        }
    }
    inplace = load(vllm_client, name, engine_adapters.a1, load_inplace=True)
    assert inplace.status_code == 200

    missing = load(vllm_client, _name("nf"), engine_adapters.root / "does-not-exist")
    assert missing.status_code == 404
    err = missing.json()["error"]
    assert err["type"] == "NotFoundError" and err["code"] == 404
    assert "failed: No adapter found for" in err["message"]

    missing_field = vllm_client.post("/v1/load_lora_adapter", json={"lora_name": "x"})
    assert missing_field.status_code == 400
    err = missing_field.json()["error"]
    assert err["type"] == "Bad Request" and err["param"] == "body.lora_path"

    empty = load(vllm_client, "", engine_adapters.a1)
    assert empty.status_code == 400
    assert empty.json()["error"]["message"] == "Both 'lora_name' and 'lora_path' must be provided."

    base_conflict = load(vllm_client, BASE, engine_adapters.a1)
    assert base_conflict.status_code == 400
    assert base_conflict.json()["error"]["type"] == "InvalidUserInput"

    gone = unload(vllm_client, _name("never"))
    assert gone.status_code == 404
    assert gone.json()["error"]["type"] == "NotFoundError"
    assert "cannot be found" in gone.json()["error"]["message"]

    get = vllm_client.get("/v1/load_lora_adapter")
    assert get.status_code == 405 and get.json() == {"detail": "Method Not Allowed"}
    assert unload(vllm_client, name).status_code == 200


def test_bad_rank_is_500_and_replica_stays_healthy(
    vllm_client: httpx.Client, engine_adapters: EngineAdapters
) -> None:
    name = _name("rank")
    r = load(vllm_client, name, engine_adapters.bad_rank)
    assert r.status_code == 500
    err = r.json()["error"]
    assert err["type"] == "InternalServerError" and err["code"] == 500
    assert err["message"].startswith("Call to add_lora method failed:")
    assert "LoRA rank 32 is greater than max_lora_rank 16." in err["message"]
    assert vllm_client.get("/health").status_code == 200
    assert name not in {c["id"] for c in vllm_client.get("/v1/models").json()["data"]}


def test_greedy_outputs_differ_per_adapter_and_are_deterministic(
    vllm_client: httpx.Client, engine_adapters: EngineAdapters
) -> None:
    n1, n2 = _name("g1"), _name("g2")
    assert load(vllm_client, n1, engine_adapters.a1).status_code == 200
    assert load(vllm_client, n2, engine_adapters.a2).status_code == 200
    base = _text(greedy(vllm_client, BASE))
    b1 = greedy(vllm_client, n1)
    assert b1["model"] == n1  # the response echoes the LoRA name
    t1, t2 = _text(b1), _text(greedy(vllm_client, n2))
    assert len({base, t1, t2}) == 3, (base, t1, t2)
    assert _text(greedy(vllm_client, n1)) == t1
    assert _text(greedy(vllm_client, BASE)) == base
    for n in (n1, n2):
        assert unload(vllm_client, n).status_code == 200


def test_unknown_model_404(vllm_client: httpx.Client) -> None:
    r = vllm_client.post("/v1/completions", json={"model": "nosuch", "prompt": "x", "max_tokens": 1})
    assert r.status_code == 404
    assert r.json() == {
        "error": {
            "message": f"The model `nosuch` does not exist. Valid aliases: {BASE}.",
            "type": "NotFoundError",
            "param": "model",
            "code": 404,
        }
    }


def test_sse_framing_with_usage(vllm_client: httpx.Client, engine_adapters: EngineAdapters) -> None:
    name = _name("sse")
    assert load(vllm_client, name, engine_adapters.a1).status_code == 200
    body = {
        "model": name,
        "messages": [{"role": "user", "content": "hello world"}],
        "max_tokens": 4,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    with vllm_client.stream("POST", "/v1/chat/completions", json=body) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        raw = r.read().decode()
    assert raw.endswith("data: [DONE]\n\n")
    events = [e for e in raw.split("\n\n") if e]
    assert all(e.startswith("data: ") for e in events)
    chunks = [json.loads(e[6:]) for e in events[:-1]]
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert all(c["object"] == "chat.completion.chunk" and c["model"] == name for c in chunks)
    assert chunks[0]["id"].startswith("chatcmpl-")
    usage = chunks[-1]
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == 4
    assert usage["system_fingerprint"].startswith("vllm-0.32.0")
    finish = [c for c in chunks[:-1] if c["choices"][0]["finish_reason"] is not None]
    assert [c["choices"][0]["finish_reason"] for c in finish] == ["length"]
    no_stream = vllm_client.post(
        "/v1/chat/completions", json={**body, "stream": False, "stream_options": {"include_usage": True}}
    )
    assert no_stream.status_code == 400
    assert no_stream.json()["error"]["param"] == "stream_options"
    assert unload(vllm_client, name).status_code == 200


def test_metrics_names_and_lora_requests_info(
    vllm_client: httpx.Client, engine_adapters: EngineAdapters
) -> None:
    name = _name("met")
    assert load(vllm_client, name, engine_adapters.a2).status_code == 200
    greedy(vllm_client, name, n=4)
    text = vllm_client.get("/metrics").text
    for metric in (
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc",
        "vllm:prompt_tokens_total",
        "vllm:generation_tokens_total",
        "vllm:request_success_total",
        "vllm:time_to_first_token_seconds_bucket",
        "vllm:e2e_request_latency_seconds_bucket",
        "vllm:lora_requests_info",
    ):
        assert metric in text, metric
    running = [ln for ln in text.splitlines() if ln.startswith("vllm:num_requests_running{")]
    assert running and f'model_name="{BASE}"' in running[0] and 'engine="0"' in running[0]
    info = [ln for ln in text.splitlines() if ln.startswith("vllm:lora_requests_info{")]
    assert info and all(f'max_lora="{ve.MAX_LORAS}"' in ln for ln in info)
    assert "vllm:gpu_cache_usage_perc" not in text
    assert unload(vllm_client, name).status_code == 200


def test_after_unload_the_name_404s_and_a_reload_serves_the_same_output(
    vllm_client: httpx.Client, engine_adapters: EngineAdapters
) -> None:
    """After unload the name 404s at once (frontend registry), and a reload under it works again."""
    name = _name("re")
    assert load(vllm_client, name, engine_adapters.a1).status_code == 200
    first = _text(greedy(vllm_client, name))
    assert unload(vllm_client, name).status_code == 200
    r = vllm_client.post("/v1/completions", json={"model": name, "prompt": "x", "max_tokens": 1})
    assert r.status_code == 404
    assert load(vllm_client, name, engine_adapters.a1).status_code == 200
    assert _text(greedy(vllm_client, name)) == first
    assert unload(vllm_client, name).status_code == 200


def test_bad_content_type_is_400(vllm_client: httpx.Client) -> None:
    r = vllm_client.post(
        "/v1/load_lora_adapter", content=b"lora_name=x", headers={"content-type": "text/plain"}
    )
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["type"] == "Bad Request" and "Unsupported Media Type" in err["message"]


@pytest.mark.parametrize("replica_index", [1])
def test_second_replica_serves_same_greedy_output(
    vllm_replicas: list[ve.VllmReplica],
    vllm_client: httpx.Client,
    engine_adapters: EngineAdapters,
    replica_index: int,
) -> None:
    """Two replicas of the same model + adapter answer identically (what the E2E tests rely on)."""
    name = _name("twin")
    other = vllm_replicas[replica_index]
    with httpx.Client(base_url=other.url, timeout=60.0) as c2:
        assert load(vllm_client, name, engine_adapters.a3).status_code == 200
        assert load(c2, name, engine_adapters.a3).status_code == 200
        assert _text(greedy(vllm_client, name)) == _text(greedy(c2, name))
        assert unload(c2, name).status_code == 200
    assert unload(vllm_client, name).status_code == 200
