"""Canary counters and the analyser lease on a real Redis (SPEC §16, §17): every gateway's
answers add up in one place, in batches (nothing reaches Redis per request), and one process at a
time holds the analyser lease; a holder that stops renewing loses it to another."""

from __future__ import annotations

import asyncio
import json

import redis.asyncio as aioredis

from gateway.canary import SAMPLES_PER_FLUSH, RedisCanaryRecorder
from registry.canary.counters import RedisCounterSource, counter_key
from registry.canary.lease import RedisLease
from registry.canary.sketch import bucket_of


def test_two_gateways_counts_add_up_in_batches(redis_url: str, redis_prefix: str) -> None:
    async def main() -> None:
        r = aioredis.from_url(redis_url)
        try:
            gw1 = RedisCanaryRecorder(r, redis_prefix, flush_interval_s=3600)
            gw2 = RedisCanaryRecorder(r, redis_prefix, flush_interval_s=3600)
            for i in range(1000):
                gw1.record("support", "v2", 502 if i % 10 == 0 else 200, 0.05)
                gw2.record("support", "v2", 200, 0.2)
            gw2.record("support", "v2", 400, None)  # the client's fault: not counted
            await asyncio.sleep(0)
            assert not await r.exists(counter_key(redis_prefix, "support", "v2"))  # nothing per request
            await gw1.flush()
            await gw2.close()  # a closing gateway flushes what it holds
            got = await RedisCounterSource(r, redis_prefix).read("support", "v2")
            assert got.requests == 2000 and got.errors == 100
            assert got.ttft == {bucket_of(0.05): 900, bucket_of(0.2): 1000}
            assert 0 < await r.ttl(counter_key(redis_prefix, "support", "v2")) <= 7 * 86400
            await gw1.close()
            assert (await RedisCounterSource(r, redis_prefix).read("other", "v1")).requests == 0
        finally:
            await r.aclose()

    asyncio.run(main())


def test_a_failed_flush_keeps_the_batch(redis_url: str, redis_prefix: str) -> None:
    async def main() -> None:
        dead = aioredis.from_url("redis://127.0.0.1:1/0", socket_connect_timeout=0.2)
        rec = RedisCanaryRecorder(dead, redis_prefix, flush_interval_s=3600)
        for _ in range(10):
            rec.record("support", "v2", 200, 0.05)
        await rec.flush()  # Redis unreachable: logged, kept
        rec.record("support", "v2", 503, None)
        live = aioredis.from_url(redis_url)
        try:
            rec.redis = live
            await rec.close()
            got = await RedisCounterSource(live, redis_prefix).read("support", "v2")
            assert (got.requests, got.errors) == (11, 1)
        finally:
            await live.aclose()
            await dead.aclose()

    asyncio.run(main())


def test_one_lease_holder_at_a_time(redis_url: str, redis_prefix: str) -> None:
    async def main() -> None:
        r = aioredis.from_url(redis_url)
        try:
            a = RedisLease(r, redis_prefix, ttl_s=0.5)
            b = RedisLease(r, redis_prefix, ttl_s=0.5)
            assert await a.hold() is True
            assert await b.hold() is False
            assert await a.hold() is True  # renewed
            await asyncio.sleep(0.7)  # a stops renewing (a dead process): b takes over
            assert await b.hold() is True
            assert await a.hold() is False
            await b.release()
            assert await a.hold() is True
            await a.release()
        finally:
            await r.aclose()

    asyncio.run(main())


def test_sampled_answers_reach_the_analyser_bounded_per_flush(redis_url: str, redis_prefix: str) -> None:
    def body(i: int) -> bytes:
        return json.dumps({"choices": [{"index": 0, "text": f"answer {i}"}]}).encode()

    async def main() -> None:
        r = aioredis.from_url(redis_url)
        try:
            gw = RedisCanaryRecorder(r, redis_prefix, flush_interval_s=3600)
            for i in range(100):
                gw.record("support", "v2", 200, 0.05, answer=body(i))
            gw.record("support", "v2", 502, None, answer=body(999))  # an error is no sample
            await gw.flush()
            gw.record("support", "v2", 200, 0.05, answer=body(100))
            await gw.close()
            source = RedisCounterSource(r, redis_prefix)
            first = await source.take_answers("support", "v2", 15)
            rest = await source.take_answers("support", "v2", 100)
            assert first == [f"answer {i}" for i in range(15)]
            assert rest == [f"answer {i}" for i in range(15, SAMPLES_PER_FLUSH)] + ["answer 100"]
            assert await source.take_answers("support", "v2", 100) == []
        finally:
            await r.aclose()

    asyncio.run(main())


def test_a_gateway_with_redis_settings_records_to_redis(redis_url: str, redis_prefix: str) -> None:
    from gateway.build import make_canary_recorder
    from gateway.settings import GatewaySettings

    async def main() -> None:
        rec = make_canary_recorder(GatewaySettings(redis_url=redis_url, redis_prefix=redis_prefix))
        assert isinstance(rec, RedisCanaryRecorder)
        rec.record("support", "v1", 200, 0.01)
        await rec.close()  # flushes, then closes its own client
        r = aioredis.from_url(redis_url)
        try:
            assert (await RedisCounterSource(r, redis_prefix).read("support", "v1")).requests == 1
        finally:
            await r.aclose()

    asyncio.run(main())
