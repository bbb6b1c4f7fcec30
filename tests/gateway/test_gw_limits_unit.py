"""Rate limits through the gateway app: headers, 429s, what counts, slot release on every exit path."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
from collections.abc import AsyncIterator

import httpx
import pytest
import uvicorn

from gateway.api import create_gateway_app
from gateway.ratelimit import RedisLimiter, make_plan
from gateway.serving import QuietServer
from kit.localservices import free_port
from kit.redis_factory import make_redis
from registry.snapshot import Limits
from router.contract import NoCapacity

from .gw_fakes import internal_client
from .test_gw_api_unit import Env, err


async def test_headers_on_every_completion_answer_and_429_message() -> None:
    e = Env(limits=Limits(rpm=3, tpm=100000))
    await e.gw.start()
    r = await e.chat("demo-base:alpha")
    assert r.status_code == 200
    assert r.headers["x-ratelimit-limit-requests"] == "3"
    assert r.headers["x-ratelimit-remaining-requests"] == "2"
    assert r.headers["x-ratelimit-reset-requests"].endswith("s")
    assert r.headers["x-ratelimit-limit-tokens"] == "100000"
    # 400, 404, 403 carry the headers but consume nothing
    for model in ["demo-base:nosuch", "demo-base:gamma"]:
        r = await e.chat(model)
        assert r.status_code in (403, 404) and r.headers["x-ratelimit-remaining-requests"] == "2"
    r = await e.client.post("/v1/chat/completions", json={"model": "demo-base"}, headers=e.h())
    assert r.status_code == 400 and r.headers["x-ratelimit-remaining-requests"] == "2"
    # GET /v1/models does not count
    for _ in range(5):
        assert (await e.client.get("/v1/models", headers=e.h())).status_code == 200
    assert (await e.chat("demo-base:alpha")).status_code == 200
    assert (await e.chat("demo-base:alpha")).status_code == 200
    r = await e.chat("demo-base:alpha")
    assert r.status_code == 429
    body = err(r)
    assert body["code"] == "rate_limit_exceeded" and body["type"] == "rate_limit_error"
    assert "requests per minute" in body["message"]
    assert int(r.headers["retry-after"]) >= 1
    assert r.headers["x-ratelimit-remaining-requests"] == "0"
    await e.gw.stop()


async def test_unlimited_tenant_has_no_headers() -> None:
    e = Env()
    await e.gw.start()
    r = await e.chat("demo-base:alpha")
    assert r.status_code == 200 and not any(h.startswith("x-ratelimit") for h in r.headers)
    await e.gw.stop()


async def test_tpm_settled_with_real_usage() -> None:
    e = Env(limits=Limits(tpm=1000))
    await e.gw.start()
    r = await e.chat("demo-base:alpha", max_tokens=400)  # reserve ~402, real usage is 12
    assert r.status_code == 200
    assert 590 <= int(r.headers["x-ratelimit-remaining-tokens"]) <= 600
    r = await e.client.get("/v1/models", headers=e.h())
    peek = await e.limiter.peek(
        make_plan(tenant_id="acme", rpm=None, tpm=1000, max_concurrency=None, estimated_tokens=0)
    )
    assert 985 <= peek[0].remaining <= 990
    r = await e.chat("demo-base:alpha", max_tokens=2000)
    assert r.status_code == 429 and "tokens per minute" in err(r)["message"]
    await e.gw.stop()


async def test_grant_limit_applies_per_adapter() -> None:
    e = Env(limits=Limits(rpm=100), grant_limits={"alpha": (1, None)})
    await e.gw.start()
    assert (await e.chat("demo-base:alpha")).status_code == 200
    r = await e.chat("demo-base:alpha")
    assert r.status_code == 429 and "grant" in err(r)["message"]
    assert (await e.chat("demo-base:beta")).status_code == 200
    await e.gw.stop()


async def test_concurrency_released_on_upstream_failure_and_error_answers() -> None:
    e = Env(limits=Limits(max_concurrency=1))
    await e.gw.start()
    e.router.fail = NoCapacity("full")
    for _ in range(3):
        assert (await e.chat("demo-base:alpha")).status_code == 503
    assert e.limiter.in_use("t:acme:conc") == 0
    e.router.fail = None
    e.router.status = 500
    assert (await e.chat("demo-base:alpha")).status_code == 502
    assert e.limiter.in_use("t:acme:conc") == 0
    e.router.status = 200
    assert (await e.chat("demo-base:alpha", stream=True)).status_code == 200
    assert e.limiter.in_use("t:acme:conc") == 0
    await e.gw.stop()


async def test_concurrency_limit_429_while_slot_held() -> None:
    e = Env(limits=Limits(max_concurrency=1))
    await e.gw.start()
    e.router.forward_delay = 0.3
    first = asyncio.create_task(e.chat("demo-base:alpha"))
    await asyncio.sleep(0.1)
    r = await e.chat("demo-base:alpha")
    assert r.status_code == 429 and "concurrent" in err(r)["message"]
    assert (await first).status_code == 200
    assert e.limiter.in_use("t:acme:conc") == 0
    await e.gw.stop()


async def held_slots(e: Env) -> int:
    n = e.limiter.in_use("t:acme:conc")
    return int(await n) if inspect.isawaitable(n) else int(n)


@contextlib.asynccontextmanager
async def serve(app: object) -> AsyncIterator[str]:
    port = free_port()
    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="off")  # type: ignore[arg-type]
    server = QuietServer(config)
    task = asyncio.create_task(server.serve())
    for _ in range(100):
        if server.started:
            break
        await asyncio.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, 10)


@pytest.mark.parametrize("backend", ["memory", "redis"])
async def test_slot_released_on_client_disconnect_mid_stream(
    backend: str, redis_url: str, redis_prefix: str
) -> None:
    e = Env(limits=Limits(max_concurrency=1))
    if backend == "redis":
        e.limiter = RedisLimiter(make_redis(redis_url), prefix=redis_prefix)  # type: ignore[assignment]
        e.gw.limiter = e.limiter
    await e.gw.start()
    e.router.n_chunks = 200
    e.router.chunk_delay = 0.05  # a 10 s stream
    app = create_gateway_app(e.gw, manage_lifecycle=False)
    async with serve(app) as url, httpx.AsyncClient(base_url=url, timeout=10) as c:
        async with c.stream(
            "POST",
            "/v1/chat/completions",
            headers=e.h(),
            json={"model": "demo-base:alpha", "messages": [{"role": "user", "content": "x"}], "stream": True},
        ) as r:
            assert r.status_code == 200
            chunks = r.aiter_bytes()  # held: a dropped iterator is closed (and so the connection)
            await chunks.__anext__()
            assert await held_slots(e) == 1
        # the client went away mid-stream: slot freed and upstream closed, well before the 10 s stream ends
        for _ in range(50):
            held = await held_slots(e)
            if held == 0 and e.router.closed_streams == 1:
                break
            await asyncio.sleep(0.05)
        assert held == 0 and e.router.closed_streams == 1
        r2 = await c.post(
            "/v1/chat/completions",
            headers=e.h(),
            json={"model": "demo-base:alpha", "messages": [{"role": "user", "content": "x"}]},
        )
        assert r2.status_code == 200
    await e.gw.stop()


async def test_redis_down_closed_and_open() -> None:
    for mode, status in (("closed", 503), ("open", 200)):
        e = Env(limits=Limits(rpm=5), ratelimit_on_error=mode)
        e.limiter = RedisLimiter(make_redis("redis://127.0.0.1:1/0"), timeout_s=0.5)  # type: ignore[assignment]
        e.gw.limiter = e.limiter
        await e.gw.start()
        r = await e.chat("demo-base:alpha")
        assert r.status_code == status
        if mode == "closed":
            assert err(r)["code"] == "rate_limiter_unavailable"
        ready = await e.client.get("/readyz")
        body = ready.json()
        assert body["ratelimit"] == {"healthy": False, "on_error": mode}
        assert body["reasons"] == ["ratelimit_store_unreachable"]
        assert ready.status_code == (503 if mode == "closed" else 200)
        detail = (await internal_client(e.gw).get("/readyz")).json()
        assert detail["ratelimit"] == {"backend": "redis", "healthy": False, "on_error": mode}
        assert any(f"ratelimit_on_error={mode}" in x for x in detail["messages"])
        await e.gw.stop()
