"""The gateway's OpenAPI document at ``GET /openapi.json`` and Schemathesis over it (SPEC §6, §18),
then hand-written hostile requests, against real processes: a ``loraplane serve --role gateway``
and a registry on PostgreSQL, Redis, the S3 server and a simulator replica. No 5xx, no dropped
connection: a malformed request is a 400 in OpenAI's shape."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import schemathesis
from schemathesis.schemas import APIOperation

from kit import localservices as ls
from tests.fuzz.fuzzer import client_sender, fuzz
from tests.gateway.gw_platform import Platform, run_platform

pytestmark = pytest.mark.fuzz

MAX_EXAMPLES = 40  # per operation and generation mode
MODELS = ("demo-base:fz", "demo-base", "demo-base:fz@v1")


@pytest.fixture(scope="module")
def plat(s3_server: ls.S3Server, redis_url: str) -> Iterator[Platform]:
    with run_platform(s3_server, redis_url, gateways=1, sims=1) as p:
        p.adapter("fz")
        p.admin.create_tenant("fz", limits={"rpm": 1_000_000, "tpm": 1_000_000_000}, base_model_access=True)
        p.admin.put_grant("fz", "fz")
        p.keys["fz"] = p.admin.issue_key("fz")["key"]
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:  # until the gateway's table has the tenant and adapter
            r = httpx.get(f"{p.gateway_urls[0]}/v1/models", headers=_auth(p))
            if r.status_code == 200 and "demo-base:fz" in {m["id"] for m in r.json()["data"]}:
                break
            time.sleep(0.1)
        yield p


def _auth(p: Platform) -> dict[str, str]:
    return {"authorization": f"Bearer {p.keys['fz']}"}


@pytest.fixture(scope="module")
def gw(plat: Platform) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=plat.gateway_urls[0], timeout=30) as c:
        yield c


def test_openapi_document_covers_v1(gw: httpx.Client) -> None:
    r = gw.get("/openapi.json")
    assert r.status_code == 200 and r.headers["content-type"].startswith("application/json")
    assert r.headers["x-request-id"]
    doc = r.json()
    assert doc["openapi"].startswith("3.")
    assert set(doc["paths"]) == {"/v1/chat/completions", "/v1/completions", "/v1/models"}
    assert doc["components"]["securitySchemes"]["TenantKey"]["scheme"] == "bearer"
    chat = doc["paths"]["/v1/chat/completions"]["post"]
    assert {"200", "400", "401", "404", "429", "503"} <= set(chat["responses"])
    for path in ("/v1/chat/completions", "/v1/completions"):  # fallback answers say so (SPEC §15)
        ok = doc["paths"][path]["post"]["responses"]["200"]
        assert ok == {"$ref": "#/components/responses/Completion"}
    headers = doc["components"]["responses"]["Completion"]["headers"]
    assert "x-loraplane-adapter-version" in headers
    assert headers["x-loraplane-fallback"]["schema"]["enum"] == ["previous_version", "base_model"]
    assert gw.post("/openapi.json").status_code == 405


def _real_model(op: APIOperation, body: Any, n: int) -> Any:
    """Two cases in three name a model the tenant may use, so they reach the replica."""
    if isinstance(body, dict) and "model" in body and n % 3 != 2:
        return {**body, "model": MODELS[n % len(MODELS)]}
    return body


def test_fuzz_gateway_finds_no_server_error(plat: Platform, gw: httpx.Client) -> None:
    schema = schemathesis.openapi.from_url(f"{plat.gateway_urls[0]}/openapi.json")
    report = fuzz(
        schema,
        client_sender(gw, _auth(plat)),
        base_url=plat.gateway_urls[0],
        max_examples=MAX_EXAMPLES,
        body=_real_model,
    )
    print(f"{report.operations} operations, {report.requests} requests, statuses {report.statuses}")
    assert report.operations == 3 and report.requests >= 150, report
    # served by the replica, refused by the gateway's checks, and unknown models alike
    assert report.statuses.get(200, 0) > 30 and report.statuses.get(400, 0) > 30, report.statuses
    assert not report.findings, "\n".join(str(f) for f in report.findings[:20])


def _err(r: httpx.Response, status: int, param: str | None = None) -> dict[str, Any]:
    assert r.status_code == status, r.text
    err: dict[str, Any] = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    if status == 400:
        assert err["type"] == "invalid_request_error" and err["code"] == "invalid_request"
    if param is not None:
        assert err["param"] == param, err
    return err


def _chat(**over: Any) -> dict[str, Any]:
    return {"model": "demo-base:fz", "messages": [{"role": "user", "content": "hi"}], **over}


@pytest.mark.parametrize(
    ("body", "param"),
    [
        (_chat(model="demo-base:fz\x00"), "model"),
        (_chat(model="demo\x07base"), "model"),
        (_chat(user="u\x00"), "user"),
        (_chat(messages=[{"role": "us\x00er", "content": "hi"}]), "messages"),
        (_chat(max_tokens=2**31), "max_tokens"),
        (_chat(max_tokens=2**63 - 1), "max_tokens"),
        (_chat(max_completion_tokens=2**40), "max_completion_tokens"),
        (_chat(n=2**62), "n"),
        (_chat(max_tokens=-(2**63)), "max_tokens"),
    ],
)
def test_hostile_chat_fields_are_400(gw: httpx.Client, plat: Platform, body: Any, param: str) -> None:
    _err(gw.post("/v1/chat/completions", json=body, headers=_auth(plat)), 400, param)


def test_hostile_bodies_are_400_or_413(gw: httpx.Client, plat: Platform) -> None:
    h = {**_auth(plat), "content-type": "application/json"}
    deep = b'{"model": "demo-base:fz", "messages": ' + b"[" * 5000 + b"]" * 5000 + b"}"
    _err(gw.post("/v1/chat/completions", content=deep, headers=h), 400)
    deep_prompt = b'{"model": "demo-base:fz", "prompt": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    _err(gw.post("/v1/completions", content=deep_prompt, headers=h), 400)
    huge_int = b'{"model": "demo-base:fz", "prompt": "hi", "max_tokens": ' + b"9" * 5000 + b"}"
    _err(gw.post("/v1/completions", content=huge_int, headers=h), 400)
    nan = b'{"model": "demo-base:fz", "prompt": "hi", "temperature": NaN}'
    _err(gw.post("/v1/completions", content=nan, headers=h), 400)
    _err(gw.post("/v1/completions", content=b"\x00\x01\x02", headers=h), 400)
    _err(gw.post("/v1/completions", content=b'{"model": "\\ud800", "prompt": "x"}', headers=h), 400)
    big = json.dumps({"model": "demo-base:fz", "prompt": "x" * (64 * 1024 * 1024)}).encode()
    assert _err(gw.post("/v1/completions", content=big, headers=h), 413)["code"] == "payload_too_large"


def test_hostile_paths_queries_and_headers_are_4xx(gw: httpx.Client, plat: Platform) -> None:
    assert gw.get("/v1/models%00", headers=_auth(plat)).status_code == 404
    assert gw.get("/v1/models?x=%00%07", headers=_auth(plat)).status_code == 200
    # bytes beyond ASCII in headers (what HTTP lets through; control characters never get past it)
    _err(gw.get("/v1/models", headers={b"authorization": b"Bearer \xe9\xff\x80"}), 401)
    key = _auth(plat)["authorization"].encode()
    odd_id = {b"authorization": key, b"x-request-id": b"a\xe9b"}
    r = gw.post("/v1/chat/completions", json=_chat(), headers=odd_id)
    assert r.status_code == 200 and r.headers["x-request-id"] != "a\xe9b"  # not echoed: not sane
    # after all of it, the gateway still serves
    assert gw.post("/v1/chat/completions", json=_chat(), headers=_auth(plat)).status_code == 200
