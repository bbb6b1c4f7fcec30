"""Sampling parameters' JSON types (issue 24.16): a wrong type is a 400 ``invalid_request`` in
OpenAI's error shape before anything is admitted or forwarded, as vLLM answers it; the right
types (and null) go through untouched."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from gateway.errors import GatewayError
from gateway.parse import parse_request

from .test_gw_api_unit import Env

CHAT = "chat/completions"
MSGS = [{"role": "user", "content": "hi"}]


def _parse(endpoint: str = CHAT, **fields: Any) -> Any:
    import orjson

    body: dict[str, Any] = {"model": "demo-base", **fields}
    body.update({"messages": MSGS} if endpoint == CHAT else {"prompt": "hi"})
    return parse_request(orjson.dumps(body), endpoint)  # type: ignore[arg-type]


WRONG: list[tuple[str, str, Any, str]] = [
    (CHAT, "temperature", "hot", "expected a number, but got a string"),
    (CHAT, "temperature", "0.5", "expected a number, but got a string"),
    (CHAT, "temperature", True, "expected a number, but got a boolean"),
    (CHAT, "top_p", [1], "expected a number, but got an array"),
    (CHAT, "presence_penalty", {}, "expected a number, but got an object"),
    (CHAT, "frequency_penalty", "x", "expected a number"),
    (CHAT, "seed", 1.5, "expected an integer, but got a number"),
    (CHAT, "seed", "42", "expected an integer, but got a string"),
    (CHAT, "stop", 3, "expected a string or an array of strings, but got an integer"),
    (CHAT, "stop", ["a", 1], "but got an array holding a member of another type"),
    (CHAT, "logprobs", 1, "expected a boolean, but got an integer"),
    (CHAT, "top_logprobs", "5", "expected an integer"),
    (CHAT, "logit_bias", {"50256": "x"}, "holding a member of another type"),
    (CHAT, "top_k", 2.5, "expected an integer"),
    (CHAT, "ignore_eos", "yes", "expected a boolean"),
    ("completions", "logprobs", True, "expected an integer, but got a boolean"),
    ("completions", "echo", 1, "expected a boolean"),
    ("completions", "best_of", "2", "expected an integer"),
    ("completions", "suffix", 3, "expected a string"),
]


@pytest.mark.parametrize(("endpoint", "field", "value", "says"), WRONG)
def test_a_wrong_type_is_a_400_naming_the_parameter(endpoint: str, field: str, value: Any, says: str) -> None:
    with pytest.raises(GatewayError) as ei:
        _parse(endpoint, **{field: value})
    e = ei.value
    assert (e.status, e.code, e.param) == (400, "invalid_request", field)
    assert e.message.startswith(f"Invalid type for '{field}': ") and says in e.message, e.message


@pytest.mark.parametrize(
    ("endpoint", "fields"),
    [
        (CHAT, {"temperature": 0, "top_p": 0.9, "presence_penalty": -1, "frequency_penalty": 0.5}),
        (CHAT, {"temperature": None, "seed": None, "stop": None, "logprobs": None}),
        (CHAT, {"seed": 42, "stop": "\n", "logprobs": True, "top_logprobs": 3, "logit_bias": {"1": -100}}),
        (CHAT, {"stop": ["a", "b"], "top_k": -1, "min_p": 0.1, "ignore_eos": False, "stop_token_ids": [2]}),
        ("completions", {"logprobs": 2, "echo": True, "best_of": 1, "suffix": "x", "temperature": 1.5}),
        (CHAT, {"some_engine_field": "anything", "temperature": 3}),  # ranges are the engine's
    ],
)
def test_the_right_types_and_null_pass(endpoint: str, fields: dict[str, Any]) -> None:
    req = _parse(endpoint, **fields)
    assert all(req.body[k] == v for k, v in fields.items())


@pytest.fixture
async def env() -> AsyncIterator[Env]:
    e = Env()
    await e.gw.start()
    yield e
    await e.gw.stop()
    await e.client.aclose()


async def test_temperature_hot_is_answered_400_in_openais_shape_and_not_forwarded(env: Env) -> None:
    r = await env.chat("demo-base:alpha", temperature="hot")
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err == {
        "message": "Invalid type for 'temperature': expected a number, but got a string instead.",
        "type": "invalid_request_error",
        "param": "temperature",
        "code": "invalid_request",
    }
    assert env.router.requests == []  # nothing admitted, nothing forwarded
    r = await env.chat("demo-base:alpha", temperature=0.2, seed=7, stop=["\n"])
    assert r.status_code == 200 and env.router.requests[-1].body["temperature"] == 0.2
