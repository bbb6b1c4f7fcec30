"""Unit tests of the gateway's rules through its ASGI app, with hand-built snapshots and a fake
router (tests/gateway/gw_fakes.py). End-to-end behaviour on real processes is in test_gw_e2e*.py."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import orjson
import pytest
from pydantic import SecretStr

from gateway.api import create_gateway_app
from gateway.ratelimit import MemoryLimiter
from gateway.service import Gateway
from gateway.settings import GatewaySettings
from gateway.table import RoutingTable
from registry.snapshot import Limits
from router.contract import AdapterLoadFailed, NoCapacity, UpstreamTimeout

from .gw_fakes import FakeRouter, internal_client, make_snapshot

ADMIN = "admin-token-123456789"


class Env:
    def __init__(self, limits: Limits | None = None, grant_limits: Any = None, **settings: Any) -> None:
        self.snap, self.keys = make_snapshot(limits=limits, grant_limits=grant_limits)
        self.router = FakeRouter()
        self.table = RoutingTable(lambda: self.snap, on_snapshot=self.router.update_snapshot, refresh_s=60)
        self.limiter = MemoryLimiter()
        self.gw = Gateway(
            GatewaySettings(admin_token=SecretStr(ADMIN), **settings),
            router=self.router,
            table=self.table,
            limiter=self.limiter,
        )
        self.app = create_gateway_app(self.gw)
        self.client = httpx.AsyncClient(transport=httpx.ASGITransport(app=self.app), base_url="http://gw")

    def h(self, tenant: str = "acme", **extra: str) -> dict[str, str]:
        return {"authorization": f"Bearer {self.keys[tenant]}", **extra}

    async def chat(self, model: str, tenant: str = "acme", **body: Any) -> httpx.Response:
        payload = {"model": model, "messages": [{"role": "user", "content": "hello"}], **body}
        return await self.client.post("/v1/chat/completions", json=payload, headers=self.h(tenant))


@pytest.fixture
async def env() -> AsyncIterator[Env]:
    e = Env()
    await e.gw.start()
    yield e
    await e.gw.stop()
    await e.client.aclose()


def err(r: httpx.Response) -> dict[str, Any]:
    body = r.json()
    # OpenAI's four fields; a 429 adds ``details`` (which level and limit, SPEC §15)
    want = {"message", "type", "param", "code"} | ({"details"} if r.status_code == 429 else set())
    assert set(body["error"]) == want
    return body["error"]


async def test_chat_ok_echoes_model_version_header_and_request_id(env: Env) -> None:
    r = await env.client.post(
        "/v1/chat/completions",
        json={"model": "demo-base:alpha", "messages": [{"role": "user", "content": "hi"}]},
        headers=env.h(**{"x-request-id": "abc-123"}),
    )
    assert r.status_code == 200
    assert r.json()["model"] == "demo-base:alpha"
    assert r.headers["x-loraplane-adapter-version"] == "v1"
    assert r.headers["x-request-id"] == "abc-123"
    fr = env.router.requests[-1]
    assert fr.version is not None and fr.version.version == "v1" and fr.want_usage and fr.tenant_id == "acme"
    assert env.router.updates == [1]


async def test_request_id_generated_on_every_answer(env: Env) -> None:
    for r in [
        await env.client.get("/healthz"),
        await env.client.get("/v1/models"),
        await env.client.post("/v1/completions", content=b"{bad"),
        await env.client.get("/nope"),
        await env.chat("demo-base:alpha"),
    ]:
        assert len(r.headers["x-request-id"]) >= 16


@pytest.mark.parametrize(
    ("body", "param"),
    [
        (b"{not json", None),
        (b"[1,2]", None),
        (b'{"messages": [{"role": "user", "content": "x"}]}', "model"),
        (b'{"model": 3, "messages": []}', "model"),
        (b'{"model": "demo-base"}', "messages"),
        (b'{"model": "demo-base", "messages": "hi"}', "messages"),
        (b'{"model": "demo-base", "messages": [{"content": "x"}]}', "messages"),
        (
            b'{"model": "demo-base", "messages": [{"role": "user", "content": "x"}], "stream": "yes"}',
            "stream",
        ),
        (
            b'{"model": "demo-base", "messages": [{"role": "user", "content": "x"}],'
            b' "stream_options": {"include_usage": true}}',
            "stream_options",
        ),
        (
            b'{"model": "demo-base", "messages": [{"role": "user", "content": "x"}], "max_tokens": -1}',
            "max_tokens",
        ),
    ],
)
async def test_malformed_bodies_are_400(env: Env, body: bytes, param: str | None) -> None:
    r = await env.client.post("/v1/chat/completions", content=body, headers=env.h())
    assert r.status_code == 400
    e = err(r)
    assert e["type"] == "invalid_request_error" and e["code"] == "invalid_request" and e["param"] == param


async def test_completions_requires_prompt(env: Env) -> None:
    r = await env.client.post("/v1/completions", json={"model": "demo-base"}, headers=env.h())
    assert r.status_code == 400 and err(r)["param"] == "prompt"
    r = await env.client.post("/v1/completions", json={"model": "demo-base", "prompt": "x"}, headers=env.h())
    assert r.status_code == 200 and r.json()["model"] == "demo-base"


async def test_auth_missing_wrong_and_admin_token(env: Env) -> None:
    body = {"model": "demo-base", "messages": [{"role": "user", "content": "x"}]}
    for headers in [
        {},
        {"authorization": "Bearer lp-nope"},
        {"authorization": f"Bearer {ADMIN}"},
        {"authorization": "Basic abc"},
    ]:
        r = await env.client.post("/v1/chat/completions", json=body, headers=headers)
        assert r.status_code == 401
        e = err(r)
        assert e["type"] == "authentication_error" and e["code"] == "invalid_api_key"
    r = await env.client.get("/v1/models", headers={"authorization": f"Bearer {ADMIN}"})
    assert r.status_code == 401


async def test_not_granted_and_unknown_are_identical_404(env: Env) -> None:
    answers = []
    for model in ["demo-base:secret", "demo-base:nosuch", "other-base:alpha", "nosuch", "demo-base:alpha@v9"]:
        r = await env.chat(model)
        assert r.status_code == 404, model
        e = err(r)
        assert e["type"] == "not_found_error" and e["code"] == "model_not_found"
        answers.append(e["message"].replace(model, "M"))
    assert len(set(answers)) == 1
    # a tenant with no grants and no base access sees everything as unknown
    r = await env.chat("demo-base:alpha", tenant="other")
    assert r.status_code == 404
    r = await env.chat("demo-base", tenant="other")
    assert r.status_code == 404


async def test_disabled_adapter_version_and_no_active(env: Env) -> None:
    r = await env.chat("demo-base:gamma")
    assert (
        r.status_code == 403 and err(r)["code"] == "adapter_disabled" and err(r)["type"] == "permission_error"
    )
    r = await env.chat("demo-base:alpha@v3")
    assert r.status_code == 403 and err(r)["code"] == "version_disabled"
    r = await env.chat("demo-base:delta")
    assert r.status_code == 404 and err(r)["code"] == "model_not_found"
    r = await env.chat("demo-base:delta@v1")  # pinned, not disabled: served without an active version
    assert r.status_code == 200 and r.headers["x-loraplane-adapter-version"] == "v1"


async def test_pinned_version_served_whatever_active(env: Env) -> None:
    r = await env.chat("demo-base:alpha@v2")
    assert r.status_code == 200 and r.headers["x-loraplane-adapter-version"] == "v2"
    assert r.json()["model"] == "demo-base:alpha@v2"


async def test_canary_split_and_sticky_user(env: Env) -> None:
    versions = [(await env.chat("demo-base:beta")).headers["x-loraplane-adapter-version"] for _ in range(300)]
    share = versions.count("v2") / len(versions)
    assert 0.2 <= share <= 0.4  # weight 30
    for user in ["u1", "u2", "u3", "u4", "u5", "u6"]:
        seen = {
            (await env.chat("demo-base:beta", user=user)).headers["x-loraplane-adapter-version"]
            for _ in range(8)
        }
        assert len(seen) == 1


async def test_models_list_only_usable(env: Env) -> None:
    r = await env.client.get("/v1/models", headers=env.h())
    assert r.status_code == 200
    body = r.json()
    assert body["object"] == "list"
    assert sorted(m["id"] for m in body["data"]) == ["demo-base", "demo-base:alpha", "demo-base:beta"]
    r = await env.client.get("/v1/models", headers=env.h("other"))
    assert r.json()["data"] == []
    assert (await env.client.get("/v1/models")).status_code == 401


async def test_router_errors_map_to_codes_with_retry_after(env: Env) -> None:
    cases = [
        (NoCapacity("full"), 503, "no_capacity"),
        (AdapterLoadFailed("bad"), 503, "adapter_load_failed"),
        (UpstreamTimeout("slow"), 504, "upstream_timeout"),
    ]
    for exc, status, code in cases:
        env.router.fail = exc
        r = await env.chat("demo-base:alpha")
        assert r.status_code == status and err(r)["code"] == code and err(r)["type"] == "server_error"
        if status == 503:
            assert int(r.headers["retry-after"]) >= 1


async def test_gateway_timeout_is_504() -> None:
    e = Env(request_timeout_s=0.05)
    await e.gw.start()
    e.router.forward_delay = 1.0
    r = await e.chat("demo-base:alpha")
    assert r.status_code == 504 and err(r)["code"] == "upstream_timeout"
    await e.gw.stop()


async def test_upstream_400_passed_in_our_shape(env: Env) -> None:
    env.router.status = 400
    env.router.error_body = (
        b'{"error":{"message":"temperature too high","type":"BadRequestError","code":400}}'
    )
    r = await env.chat("demo-base:alpha")
    assert r.status_code == 400 and err(r)["message"] == "temperature too high"


async def test_streaming_passes_chunks_and_usage_only_when_asked(env: Env) -> None:
    async with env.client.stream(
        "POST",
        "/v1/chat/completions",
        headers=env.h(),
        json={"model": "demo-base:alpha", "messages": [{"role": "user", "content": "x"}], "stream": True},
    ) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        text = (await r.aread()).decode()
    events = [line[6:] for line in text.split("\n") if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [orjson.loads(e) for e in events[:-1]]
    assert all(c["model"] == "demo-base:alpha" for c in chunks)
    assert not any("usage" in c for c in chunks)
    assert env.router.requests[-1].want_usage and not env.router.requests[-1].client_wants_usage
    r = await env.chat("demo-base:alpha", stream=True, stream_options={"include_usage": True})
    events = [line[6:] for line in r.text.split("\n") if line.startswith("data: ")]
    assert orjson.loads(events[-2])["usage"]["total_tokens"] == 12
    assert env.router.closed_streams == 2


async def test_readyz_and_metrics(env: Env) -> None:
    internal = internal_client(env.gw)
    r = await env.client.get("/readyz")
    assert (
        r.status_code == 200
        and r.json()["ready"]
        and r.json()["ratelimit"]
        == {
            "healthy": True,
            "on_error": "closed",
        }
    )
    assert (await internal.get("/readyz")).json()["ratelimit"]["backend"] == "memory"
    env.router.is_ready = False  # no healthy replica: still ready (SPEC §17), the 503 is per request
    r = await env.client.get("/readyz")
    assert r.status_code == 200 and r.json()["replicas_healthy"] == 0
    assert r.json()["warnings"] == ["no_healthy_replica"]
    detail = (await internal.get("/readyz")).json()
    assert detail["messages"] == ["no healthy replica: requests get 503 no_capacity"]
    await env.chat("demo-base:alpha")
    assert (await env.client.get("/metrics")).status_code == 404  # not on the public port (SPEC §19)
    m = (await internal.get("/metrics")).text
    assert 'loraplane_gateway_requests_total{adapter="alpha",code="200",endpoint="chat/completions"' in m
    assert "loraplane_gateway_tokens_total" in m


async def test_not_ready_before_first_snapshot() -> None:
    def boom() -> Any:
        raise RuntimeError("db down")

    e = Env()
    e.table = RoutingTable(boom, refresh_s=60)
    e.gw.table = e.table
    await e.gw.start()
    r = await e.chat("demo-base:alpha")
    assert r.status_code == 503 and err(r)["code"] == "not_ready"
    assert (await e.client.get("/readyz")).status_code == 503
    await e.gw.stop()


async def test_body_too_large_is_413() -> None:
    e = Env(max_body_bytes=100)
    await e.gw.start()
    r = await e.chat("demo-base:alpha", extra="x" * 200)
    assert r.status_code == 413
    await e.gw.stop()
