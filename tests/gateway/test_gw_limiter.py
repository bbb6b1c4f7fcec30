"""The same test matrix against the in-memory limiter and the Redis limiter (real Redis)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from gateway.ratelimit import (
    AdmissionPlan,
    LimiterUnavailable,
    MemoryLimiter,
    RedisLimiter,
    format_reset,
    make_plan,
    rate_limit_headers,
)
from kit.redis_factory import make_redis


@pytest.fixture(params=["memory", "redis"])
async def limiters(request: pytest.FixtureRequest, redis_url: str, redis_prefix: str) -> AsyncIterator[list]:
    """Two limiter instances sharing one store (two gateway processes)."""
    if request.param == "memory":
        m = MemoryLimiter()
        yield [m, m]
        return
    a = RedisLimiter(make_redis(redis_url), prefix=redis_prefix, timeout_s=10)
    b = RedisLimiter(make_redis(redis_url), prefix=redis_prefix, timeout_s=10)
    yield [a, b]
    await a.close()
    await b.close()


def plan(**kw: Any) -> AdmissionPlan:
    base: dict[str, Any] = dict(tenant_id="t1", rpm=None, tpm=None, max_concurrency=None, estimated_tokens=10)
    base.update(kw)
    return make_plan(**base)


async def test_rpm_admits_up_to_limit_then_rejects_with_retry_after(limiters):
    lim = limiters[0]
    p = plan(rpm=3)
    results = [await lim.admit(p) for _ in range(4)]
    assert [r.admitted for r in results] == [True, True, True, False]
    assert [r.states[0].remaining for r in results[:3]] == [2, 1, 0]
    rej = results[3]
    assert rej.rejected_kind == "rpm" and rej.rejected_scope == "tenant" and rej.rejected_limit == 3
    assert 15 <= rej.retry_after_s <= 20.5  # one request refills in 60/3 = 20 s


async def test_rejection_consumes_nothing(limiters):
    lim = limiters[0]
    # tenant rpm has room, grant rpm of 1 will reject the second request: tenant bucket untouched
    p = plan(rpm=10, tpm=1000, adapter_id="a", grant_rpm=1)
    first = await lim.admit(p)
    assert first.admitted
    before = {s.bucket.key: s.remaining for s in await lim.peek(p)}
    assert before["t:t1:rpm"] in (9, 10) and 990 <= before["t:t1:tpm"] <= 1000
    second = await lim.admit(p)
    assert not second.admitted and second.rejected_scope == "grant" and second.rejected_kind == "rpm"
    after = {s.bucket.key: s.remaining for s in await lim.peek(p)}
    # buckets only refill over time: nothing was taken by the rejected admission
    assert after["t:t1:rpm"] >= before["t:t1:rpm"] and after["t:t1:tpm"] >= before["t:t1:tpm"]
    # concurrency rejection consumes no rpm either
    pc = plan(rpm=10, max_concurrency=1)
    ok = await lim.admit(pc)
    assert ok.admitted
    before = (await lim.peek(pc))[0].remaining
    rej = await lim.admit(pc)
    assert not rej.admitted and rej.rejected_kind == "concurrency"
    assert (await lim.peek(pc))[0].remaining == before
    await lim.settle(ok.lease, None)


async def test_tpm_estimate_then_settlement_refunds_and_charges(limiters):
    lim = limiters[0]
    p = plan(tpm=1000, estimated_tokens=400)
    a = await lim.admit(p)
    b = await lim.admit(p)
    assert a.admitted and b.admitted
    c = await lim.admit(p)
    assert not c.admitted and c.rejected_kind == "tpm"  # 200 left < 400
    await lim.settle(a.lease, 50)  # real usage 50: refund 350
    remaining = (await lim.peek(p))[0].remaining
    assert 550 <= remaining <= 552
    await lim.settle(a.lease, 50)  # idempotent
    assert (await lim.peek(p))[0].remaining <= 552
    await lim.settle(b.lease, 700)  # overrun: charge 300 more
    assert 250 <= (await lim.peek(p))[0].remaining <= 253


async def test_request_larger_than_tpm_is_rejected(limiters):
    r = await limiters[0].admit(plan(tpm=100, estimated_tokens=500))
    assert not r.admitted and r.rejected_kind == "tpm" and r.retry_after_s == 60


async def test_concurrency_released_on_settle_from_other_instance(limiters):
    a, b = limiters
    p = plan(max_concurrency=2)
    r1, r2 = await a.admit(p), await b.admit(p)
    assert r1.admitted and r2.admitted
    assert not (await a.admit(p)).admitted
    await b.settle(r1.lease, None)  # released by the other process
    r3 = await a.admit(p)
    assert r3.admitted
    await a.settle(r2.lease, 5)
    await a.settle(r3.lease, 5)
    assert (await b.admit(p)).admitted


async def test_grant_tpm_and_tenant_tpm_both_apply(limiters):
    lim = limiters[0]
    p = plan(tpm=10000, estimated_tokens=100, adapter_id="a", grant_tpm=150)
    assert (await lim.admit(p)).admitted
    r = await lim.admit(p)
    assert not r.admitted and r.rejected_kind == "tpm" and r.rejected_scope == "grant"
    other_adapter = plan(tpm=10000, estimated_tokens=100, adapter_id="b", grant_tpm=150)
    assert (await lim.admit(other_adapter)).admitted


async def test_atomic_200_concurrent_against_50(limiters):
    a, b = limiters
    p = plan(rpm=50, tpm=10**9, estimated_tokens=1)
    results = await asyncio.gather(*[(a if i % 2 else b).admit(p) for i in range(200)])
    assert sum(r.admitted for r in results) == 50
    pc = plan(max_concurrency=50)
    results = await asyncio.gather(*[(a if i % 2 else b).admit(pc) for i in range(200)])
    assert sum(r.admitted for r in results) == 50
    for r in results:
        if r.admitted:
            await a.settle(r.lease, None)
    again = await asyncio.gather(*[b.admit(pc) for _ in range(60)])
    assert sum(r.admitted for r in again) == 50


async def test_headers_pick_tightest_and_leave_out_unlimited(limiters):
    lim = limiters[0]
    r = await lim.admit(plan(rpm=100, adapter_id="a", grant_rpm=5))
    h = dict(rate_limit_headers(r.states))
    assert h[b"x-ratelimit-limit-requests"] == b"5"
    assert h[b"x-ratelimit-remaining-requests"] == b"4"
    assert h[b"x-ratelimit-reset-requests"] == b"12s"
    assert b"x-ratelimit-limit-tokens" not in h


def test_format_reset():
    assert format_reset(0.0123) == "13ms"
    assert format_reset(1.0) == "1s"
    assert format_reset(1.45) == "1.5s"
    assert format_reset(360) == "6m0s"
    assert format_reset(61.2) == "1m2s"


async def test_redis_down_raises_limiter_unavailable():
    lim = RedisLimiter(make_redis("redis://127.0.0.1:1/0"), timeout_s=0.5)
    with pytest.raises(LimiterUnavailable):
        await lim.admit(plan(rpm=5))
    assert not await lim.healthy()
    await lim.close()
