"""The settlement of an answer (tokens corrected, concurrency slot released) is done before the
client can see the answer's end — a whole answer's body, a stream's ``[DONE]`` event — so its next
request, at any gateway, finds its slot free; a settlement whose request is cancelled still goes
out (cancelled before it is written, or while its reply waits); a settlement against a dead
store, and in process."""

from __future__ import annotations

import asyncio

import pytest

from gateway.ratelimit import AdmissionPlan, LimiterUnavailable, MemoryLimiter, RedisLimiter, make_plan
from gateway.ratelimit.base import lease_for
from kit.redis_factory import make_redis


def _plan() -> AdmissionPlan:
    return make_plan(tenant_id="t", rpm=None, tpm=1_000_000, max_concurrency=1, estimated_tokens=10)


async def test_settle_against_a_dead_store_raises_limiter_unavailable() -> None:
    lim = RedisLimiter(make_redis("redis://127.0.0.1:1/0"), prefix="x:", lease_s=30, timeout_s=1)
    lease = make_plan(tenant_id="t", rpm=None, tpm=None, max_concurrency=1, estimated_tokens=1)
    try:
        with pytest.raises(LimiterUnavailable, match="unreachable"):
            await lim.settle(lease_for(lease, "p:1"), None)
    finally:
        await lim.close()


async def test_memory_limiter_settles_at_once() -> None:
    lim = MemoryLimiter()
    r = await lim.admit(_plan())
    assert r.admitted and r.lease is not None
    assert not (await lim.admit(_plan())).admitted  # max_concurrency 1: held
    await lim.settle(r.lease, 5)
    assert (await lim.admit(_plan())).admitted  # released at once


async def _slot_free_at_the_end(redis_url: str, redis_prefix: str, stream: bool) -> None:
    """Through the gateway app (fake router, real Redis limiter, tenant max_concurrency 1): at the
    moment the client would see the end of the answer (the whole body; a stream's [DONE] event),
    another gateway process's admission for the tenant is already admitted."""
    from collections.abc import MutableMapping
    from typing import Any

    import orjson
    from pydantic import SecretStr

    from gateway.api import create_gateway_app
    from gateway.service import Gateway
    from gateway.settings import GatewaySettings
    from gateway.table import RoutingTable
    from registry.snapshot import Limits

    from .gw_fakes import FakeRouter, make_snapshot

    snap, keys = make_snapshot(limits=Limits(max_concurrency=1))
    router = FakeRouter()
    mine = RedisLimiter(make_redis(redis_url), prefix=redis_prefix, lease_s=30, timeout_s=5, process_id="gw")
    other = RedisLimiter(make_redis(redis_url), prefix=redis_prefix, lease_s=30, timeout_s=5, process_id="o")
    gw = Gateway(
        GatewaySettings(admin_token=SecretStr("admin-token-123456789")),
        router=router,
        table=RoutingTable(lambda: snap, on_snapshot=router.update_snapshot, refresh_s=60),
        limiter=mine,
    )
    app = create_gateway_app(gw)
    await gw.start()
    seen_at_end: list[bool] = []
    try:
        plan = make_plan(tenant_id="acme", rpm=None, tpm=None, max_concurrency=1, estimated_tokens=1)
        body = orjson.dumps(
            {"model": "demo-base:alpha", "messages": [{"role": "user", "content": "hi"}], "stream": stream}
        )
        first = [{"type": "http.request", "body": body, "more_body": False}]

        async def receive() -> dict[str, Any]:
            if first:
                return first.pop()
            await asyncio.sleep(3600)
            return {"type": "http.disconnect"}

        async def send(msg: MutableMapping[str, Any]) -> None:
            if msg["type"] != "http.response.body":
                assert msg["status"] == 200
                return
            chunk = msg.get("body", b"")
            if (not stream and chunk) or b"[DONE]" in chunk:
                r = await other.admit(plan)  # the client's next request, at another gateway
                seen_at_end.append(r.admitted)
                if r.lease is not None:
                    await other.settle(r.lease, None)

        scope = {
            "type": "http", "method": "POST", "path": "/v1/chat/completions", "query_string": b"",
            "headers": [(b"authorization", f"Bearer {keys['acme']}".encode())],
        }  # fmt: skip
        for _ in range(5):
            await app(scope, receive, send)
            first.append({"type": "http.request", "body": body, "more_body": False})
        assert seen_at_end == [True] * 5, seen_at_end
    finally:
        await gw.stop()
        await other.close()


async def test_a_whole_answer_frees_its_slot_before_the_client_has_it(
    redis_url: str, redis_prefix: str
) -> None:
    await _slot_free_at_the_end(redis_url, redis_prefix, stream=False)


async def test_a_stream_frees_its_slot_before_the_client_sees_done(redis_url: str, redis_prefix: str) -> None:
    await _slot_free_at_the_end(redis_url, redis_prefix, stream=True)


async def _cancelled_settlement_releases(redis_url: str, redis_prefix: str, *, behind_blocking: bool) -> None:
    a = RedisLimiter(make_redis(redis_url), prefix=redis_prefix, lease_s=30, timeout_s=5, process_id="a")
    b = RedisLimiter(make_redis(redis_url), prefix=redis_prefix, lease_s=30, timeout_s=5, process_id="b")
    try:
        plan = _plan()
        held = await a.admit(plan)
        assert held.lease is not None
        busy = None
        if behind_blocking:  # Redis runs the settlement only after this command of the same connection
            busy = a._pipe.execute("BLPOP", redis_prefix + "never", "0.3")
            await asyncio.sleep(0.05)
        settling = asyncio.create_task(a.settle(held.lease, None))
        await asyncio.sleep(0.05 if behind_blocking else 0)  # written and waiting / queued, not written
        assert not settling.done()
        settling.cancel()
        with pytest.raises(asyncio.CancelledError):
            await settling
        if busy is not None:
            assert await busy is None
        for _ in range(50):
            r = await b.admit(plan)
            if r.admitted:
                break
            await asyncio.sleep(0.02)
        assert r.admitted, "the cancelled settlement was left out: the slot stays taken"
    finally:
        await a.close()
        await b.close()


async def test_a_settlement_cancelled_before_it_is_written_still_releases_the_slot(
    redis_url: str, redis_prefix: str
) -> None:
    """The request is cancelled (its client went away) in the loop step its settlement was queued
    in: the settlement still goes out, so the slot is free then, not after the lease expires."""
    await _cancelled_settlement_releases(redis_url, redis_prefix, behind_blocking=False)


async def test_a_settlement_cancelled_while_its_reply_waits_still_releases_the_slot(
    redis_url: str, redis_prefix: str
) -> None:
    """Cancelled while Redis has not run the settlement yet (it waits behind a blocking command of
    the same connection): it still runs, and nothing is left unretrieved."""
    await _cancelled_settlement_releases(redis_url, redis_prefix, behind_blocking=True)
