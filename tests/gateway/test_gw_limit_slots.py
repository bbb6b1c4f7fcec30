"""Concurrency slots with liveness (SPEC §17) and every limit level in one admission (SPEC §15),
on the real Redis with real processes: a gateway-like child process holds slots through the
Redis limiter; SIGKILLed, its slots free within the lease; alive, it keeps them past the lease."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from gateway.ratelimit import AdmissionPlan, AdmitResult, MemoryLimiter, RedisLimiter, make_plan
from kit.redis_factory import make_redis
from registry.snapshot import Limits

# A child process that admits N requests of tenant "t" (concurrency limit L) through the Redis
# limiter with the given lease, prints "held", holds them for HOLD seconds, settles and exits.
CHILD = """
import asyncio, sys
from gateway.ratelimit import RedisLimiter, make_plan
from kit.redis_factory import make_redis

async def main() -> None:
    url, prefix, lease, n, limit, hold = sys.argv[1:7]
    lim = RedisLimiter(make_redis(url), prefix=prefix, lease_s=float(lease), timeout_s=5)
    plan = make_plan(tenant_id="t", rpm=None, tpm=None, max_concurrency=int(limit), estimated_tokens=1)
    leases = []
    for _ in range(int(n)):
        r = await lim.admit(plan)
        assert r.admitted and r.lease is not None
        leases.append(r.lease)
    print("held", flush=True)
    await asyncio.sleep(float(hold))
    for lease in leases:
        await lim.settle(lease, None)
    print("released", flush=True)
    await lim.close()

asyncio.run(main())
"""


def _tenant_plan(limit: int) -> AdmissionPlan:
    return make_plan(tenant_id="t", rpm=None, tpm=None, max_concurrency=limit, estimated_tokens=1)


@pytest.fixture
def child(redis_url: str, redis_prefix: str) -> Iterator[Any]:
    procs: list[subprocess.Popen[str]] = []

    def start(lease_s: float, n: int, limit: int, hold_s: float) -> subprocess.Popen[str]:
        p = subprocess.Popen(
            [
                sys.executable,
                "-c",
                CHILD,
                redis_url,
                redis_prefix,
                str(lease_s),
                str(n),
                str(limit),
                str(hold_s),
            ],
            stdout=subprocess.PIPE,
            text=True,
            cwd=os.getcwd(),
            start_new_session=True,
        )
        procs.append(p)
        assert p.stdout is not None and p.stdout.readline().strip() == "held"
        return p

    yield start
    for p in procs:
        if p.poll() is None:
            p.kill()
        p.wait(10)
        if p.stdout is not None:
            p.stdout.close()


@pytest.fixture
async def limiters(redis_url: str, redis_prefix: str) -> AsyncIterator[Any]:
    """This process's limiter, with the lease every process of the test shares."""
    made: list[RedisLimiter] = []

    def make(lease_s: float) -> RedisLimiter:
        made.append(RedisLimiter(make_redis(redis_url), prefix=redis_prefix, lease_s=lease_s, timeout_s=5))
        return made[-1]

    yield make
    for lim in made:
        await lim.close()


async def test_sigkilled_holder_frees_its_slots_within_the_lease_and_retry_after_is_true(
    child: Any, limiters: Any
) -> None:
    lease_s = 3.0
    limiter = limiters(lease_s)
    holder = child(lease_s, 2, 2, 600)
    await asyncio.sleep(1.2)  # past one renewal
    r = await limiter.admit(_tenant_plan(2))
    assert not r.admitted and r.rejected_kind == "concurrency" and r.rejected_scope == "tenant"
    assert r.retry_after_s == 1  # a live request holds the slots: it frees them when it ends
    os.killpg(holder.pid, signal.SIGKILL)
    holder.wait(10)
    killed = time.monotonic()
    tries: list[tuple[float, float, AdmitResult]] = []  # (sent, answered, result)
    while time.monotonic() - killed < lease_s + 2:
        sent = time.monotonic()
        r = await limiter.admit(_tenant_plan(2))
        tries.append((sent, time.monotonic(), r))
        if r.admitted:
            break
        await asyncio.sleep(0.05)
    admitted = tries[-1][2]
    assert admitted.admitted, "the dead process's slots never expired"
    # the first slot expired between the last refusal and the admission
    freed_after, freed_by = tries[-2][0], tries[-1][1]
    assert freed_by - killed <= lease_s + 0.5
    # once the holder missed a renewal, a refusal's Retry-After says when its slot frees
    stale = [(s, a, r.retry_after_s) for s, a, r in tries[:-1] if r.retry_after_s != 1]
    assert stale, [(s - killed, r.retry_after_s) for s, _, r in tries]
    for sent, answered, ra in stale:
        assert sent + ra <= freed_by + 0.15 and answered + ra >= freed_after - 0.15, (
            sent - killed, ra, freed_after - killed, freed_by - killed,
        )  # fmt: skip
    assert admitted.lease is not None
    await limiter.settle(admitted.lease, None)
    assert await limiter.in_use("t:t:conc") == 0


async def test_live_long_request_keeps_its_slot_past_the_lease(child: Any, limiters: Any) -> None:
    lease_s = 1.5
    limiter = limiters(lease_s)
    holder = child(lease_s, 1, 1, 4.5)
    t0 = time.monotonic()
    seen = 0
    while time.monotonic() - t0 < 3.5:  # over two leases long
        r = await limiter.admit(_tenant_plan(1))
        assert not r.admitted, f"slot lost {time.monotonic() - t0:.2f}s after admission"
        assert r.retry_after_s == 1
        seen += 1
        await asyncio.sleep(0.1)
    assert seen >= 10
    assert holder.stdout is not None and holder.stdout.readline().strip() == "released"
    assert holder.wait(10) == 0
    r = await limiter.admit(_tenant_plan(1))
    assert r.admitted and r.lease is not None
    await limiter.settle(r.lease, None)


async def test_settled_lease_is_not_renewed_back(limiters: Any) -> None:
    limiter = limiters(30.0)
    r = await limiter.admit(_tenant_plan(3))
    assert r.admitted and r.lease is not None and limiter.held() == 1
    await limiter.settle(r.lease, None)
    assert limiter.held() == 0 and await limiter.renew() == 0
    assert await limiter.in_use("t:t:conc") == 0


@pytest.fixture(params=["memory", "redis"])
async def any_limiter(
    request: pytest.FixtureRequest, redis_url: str, redis_prefix: str
) -> AsyncIterator[Any]:
    if request.param == "memory":
        yield MemoryLimiter()
        return
    lim = RedisLimiter(make_redis(redis_url), prefix=redis_prefix, timeout_s=10)
    yield lim
    await lim.close()


def _plan(
    tenant: str,
    adapter: str,
    owner: str | None = "biz",
    *,
    rpm: int | None = None,
    adapter_limits: Limits | None = None,
    owner_limits: Limits | None = None,
) -> AdmissionPlan:
    return make_plan(
        tenant_id=tenant, rpm=rpm, tpm=None, max_concurrency=None, estimated_tokens=10,
        adapter_id=adapter, adapter_limits=adapter_limits, owner=owner, owner_limits=owner_limits,
    )  # fmt: skip


async def test_adapter_limits_are_shared_by_all_tenants(any_limiter: Any) -> None:
    lim = any_limiter
    limits = Limits(rpm=2)
    assert (await lim.admit(_plan("a", "x", adapter_limits=limits))).admitted
    assert (await lim.admit(_plan("b", "x", adapter_limits=limits))).admitted
    r = await lim.admit(_plan("c", "x", adapter_limits=limits, rpm=100))
    assert not r.admitted and (r.rejected_scope, r.rejected_kind, r.rejected_limit) == ("adapter", "rpm", 2)
    assert r.details() == {
        "level": "adapter",
        "limit": "rpm",
        "value": 2,
        "retry_after_s": r.details()["retry_after_s"],
    }
    assert 25 <= r.retry_after_s <= 30.5  # one request refills in 60/2 s
    # the rejection consumed nothing: tenant c's own bucket is still full
    peek = await lim.peek(
        make_plan(tenant_id="c", rpm=100, tpm=None, max_concurrency=None, estimated_tokens=0)
    )
    assert peek[0].remaining == 100
    assert (await lim.admit(_plan("c", "other", adapter_limits=limits))).admitted  # another adapter


async def test_owner_limits_span_the_owners_adapters_and_concurrency(any_limiter: Any) -> None:
    lim = any_limiter
    owner = Limits(max_concurrency=2, tpm=1000)
    a = await lim.admit(_plan("t1", "x", owner_limits=owner))
    b = await lim.admit(_plan("t2", "y", owner_limits=owner))
    assert a.admitted and b.admitted
    r = await lim.admit(_plan("t3", "z", owner_limits=owner))
    assert not r.admitted and (r.rejected_scope, r.rejected_kind) == ("owner", "concurrency")
    assert r.details()["limit"] == "max_concurrency" and r.details()["value"] == 2
    assert (await lim.admit(_plan("t3", "z", owner="other", owner_limits=owner))).admitted
    await lim.settle(a.lease, 10)
    c = await lim.admit(_plan("t3", "z", owner_limits=owner))
    assert c.admitted  # a slot freed on settle
    assert lim.name == "memory" or await lim.in_use("o:biz:conc") == 2


async def test_one_admission_checks_every_level_and_commits_all_or_nothing(any_limiter: Any) -> None:
    lim = any_limiter

    def full(tenant: str) -> AdmissionPlan:
        return make_plan(
            tenant_id=tenant, rpm=10, tpm=None, max_concurrency=5, estimated_tokens=10,
            adapter_id="x", grant_rpm=10, adapter_limits=Limits(rpm=10, max_concurrency=5),
            owner="biz", owner_limits=Limits(rpm=1, max_concurrency=5),
        )  # fmt: skip

    p = full("t1")
    assert {b.scope for b in p.buckets} == {"tenant", "grant", "adapter", "owner"}
    assert {s.scope for s in p.slots} == {"tenant", "adapter", "owner"}
    ok = await lim.admit(p)
    assert ok.admitted
    r = await lim.admit(full("t2"))
    assert not r.admitted and r.rejected_scope == "owner" and r.rejected_kind == "rpm"
    # nothing of t2's tenant, grant or adapter levels was taken, and no slot was opened
    states = {s.bucket.scope: s.remaining for s in await lim.peek(full("t2"))}
    assert states == {"tenant": 10, "grant": 10, "adapter": 9, "owner": 0}
    assert lim.in_use("a:x:conc") == 1 if lim.name == "memory" else await lim.in_use("a:x:conc") == 1


async def test_one_script_call_per_admission_and_one_per_renewal_batch(
    limiters: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every level adds keys to the one admission script, never a round trip; renewal of all the
    slots a process holds is one script call, not one per request."""
    limiter: RedisLimiter = limiters(30.0)
    calls: list[tuple[Any, ...]] = []
    execute = limiter._pipe.execute

    def counting(*args: Any) -> Any:
        calls.append(args)
        return execute(*args)

    monkeypatch.setattr(limiter._pipe, "execute", counting)

    def full(tenant: str, adapter: str) -> AdmissionPlan:
        return make_plan(
            tenant_id=tenant, rpm=1000, tpm=10**6, max_concurrency=100, estimated_tokens=10,
            adapter_id=adapter, grant_rpm=1000, grant_tpm=10**6,
            adapter_limits=Limits(rpm=1000, tpm=10**6, max_concurrency=100),
            owner="biz", owner_limits=Limits(rpm=1000, tpm=10**6, max_concurrency=100),
        )  # fmt: skip

    results = await asyncio.gather(*[limiter.admit(full(f"t{i % 5}", f"a{i % 3}")) for i in range(40)])
    assert all(r.admitted for r in results) and len(calls) == 40
    assert limiter.held() == 40
    calls.clear()
    assert await limiter.renew() == 40 * 3  # tenant, adapter and owner slot of each lease
    assert len(calls) == 1
    for r in results:
        assert r.lease is not None
        await limiter.settle(r.lease, 5)
    assert await limiter.in_use("o:biz:conc") == 0 and limiter.held() == 0


async def test_zero_limits_refuse_with_a_clear_429_not_an_error(any_limiter: Any) -> None:
    """A limit of 0 at any level is a kill switch for that level: refused, never a store error."""
    lim = any_limiter
    for limits in (Limits(max_concurrency=0), Limits(rpm=0), Limits(tpm=0)):
        r = await lim.admit(_plan("t", "x", adapter_limits=limits))
        assert not r.admitted and r.rejected_scope == "adapter" and r.retry_after_s == 60
    r = await lim.admit(make_plan(tenant_id="t", rpm=None, tpm=None, max_concurrency=0, estimated_tokens=1))
    assert not r.admitted and r.rejected_kind == "concurrency" and r.retry_after_s == 60
