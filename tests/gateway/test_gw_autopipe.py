"""The limiter's auto-pipelining: many concurrent calls share round trips, each keeps its own
atomic script run and its own reply or error; Redis down, restarted, flushed or silent."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis
from redis.asyncio.connection import Connection
from redis.exceptions import ResponseError

from gateway.ratelimit import LimiterUnavailable, RedisLimiter, make_plan
from gateway.ratelimit.autopipe import AutoPipeline, RoundTripError, pack
from kit.procs import ManagedProcess, free_port, tcp_ready
from kit.redis_factory import make_redis


def plan(tenant: str = "t1", **kw: Any):  # type: ignore[no-untyped-def]
    base: dict[str, Any] = dict(
        tenant_id=tenant, rpm=None, tpm=None, max_concurrency=None, estimated_tokens=10
    )
    base.update(kw)
    return make_plan(**base)


@pytest.fixture
async def limiter(redis_url: str, redis_prefix: str) -> AsyncIterator[RedisLimiter]:
    lim = RedisLimiter(make_redis(redis_url), prefix=redis_prefix, timeout_s=10)
    yield lim
    await lim.close()


def test_pack_encodes_like_redis_py() -> None:
    from enum import StrEnum

    class Word(StrEnum):
        GET = "GET"

    conn = Connection()
    cases = [
        ("EVALSHA", "abc", 2, "k:a", "k:b", 900.0, -3, 0.1, 10**12, 1e-7),  # ASCII
        ("EVALSHA", "abc", 2, "k:é", b"raw\r\n", 900.0, -3, 0.1),  # non-ASCII, bytes
        (Word.GET, "k"),  # a str subclass
        ("SET", "k", ""),
    ]
    for args in cases:
        assert pack(args) == b"".join(conn.pack_command(*args)), args
    with pytest.raises(TypeError):
        pack(("SET", "k", True))


async def test_concurrent_admissions_share_round_trips_and_stay_atomic(limiter: RedisLimiter) -> None:
    p = plan(rpm=150, max_concurrency=1000)
    before = limiter._pipe.round_trips
    results = await asyncio.gather(*[limiter.admit(p) for _ in range(200)])
    assert sum(r.admitted for r in results) == 150  # each admission checked and took atomically
    assert limiter._pipe.round_trips - before < 50  # ... in far fewer round trips than calls
    # every caller got its own answer: the 150 admitted saw 149, 148, ... 0 left, once each
    assert sorted(r.states[0].remaining for r in results if r.admitted) == list(range(150))
    assert all(r.rejected_kind == "rpm" for r in results if not r.admitted)
    assert await limiter.in_use("t:t1:conc") == 150
    await asyncio.gather(*[limiter.settle(r.lease, 5) for r in results if r.lease is not None])
    assert await limiter.in_use("t:t1:conc") == 0


async def test_each_caller_gets_its_own_result_across_tenants(limiter: RedisLimiter) -> None:
    plans = [plan(f"tenant{i}", rpm=i + 1) for i in range(40)]
    results = await asyncio.gather(*[limiter.admit(p) for p in plans])
    for i, r in enumerate(results):
        assert r.admitted and r.states[0].bucket.limit == i + 1 and r.states[0].remaining == i


async def test_an_error_reply_fails_only_its_own_caller(
    limiter: RedisLimiter, redis_url: str, redis_prefix: str
) -> None:
    r = make_redis(redis_url)
    await r.set(f"{redis_prefix}rl:t:broken:rpm", "not a hash")  # the script's HMGET fails on it
    results = await asyncio.gather(
        *[limiter.admit(plan(f"ok{i}", rpm=5)) for i in range(5)],
        limiter.admit(plan("broken", rpm=5)),
        *[limiter.admit(plan(f"ok{i}", rpm=5)) for i in range(5, 10)],
        return_exceptions=True,
    )
    assert isinstance(results[5], LimiterUnavailable) and "WRONGTYPE" in str(results[5])
    assert all(not isinstance(x, BaseException) and x.admitted for i, x in enumerate(results) if i != 5)
    # the connection stays usable
    assert (await limiter.admit(plan("ok0", rpm=5))).states[0].remaining == 3
    await r.aclose()


async def test_raw_pipeline_mixes_replies_and_errors(redis_url: str, redis_prefix: str) -> None:
    r = make_redis(redis_url)
    pipe = AutoPipeline(r, timeout_s=5)
    await r.set(f"{redis_prefix}s", "x")
    futs = [pipe.execute("INCR", f"{redis_prefix}n") for _ in range(10)]
    bad = pipe.execute("INCR", f"{redis_prefix}s")
    more = [pipe.execute("INCR", f"{redis_prefix}n") for _ in range(10)]
    got = await asyncio.gather(*futs, *more)
    assert got == list(range(1, 21))  # in order, one reply each
    with pytest.raises(ResponseError):
        await bad
    assert pipe.round_trips == 1  # issued in one event-loop turn: one round trip
    await pipe.aclose()
    assert await pipe.execute("INCR", f"{redis_prefix}n") == 21  # usable again, like redis-py
    await pipe.aclose()
    await r.aclose()


async def test_redis_down_every_caller_gets_limiter_unavailable() -> None:
    lim = RedisLimiter(make_redis("redis://127.0.0.1:1/0"), timeout_s=0.5)
    t0 = time.monotonic()
    results = await asyncio.gather(*[lim.admit(plan(rpm=5)) for _ in range(20)], return_exceptions=True)
    assert all(isinstance(x, LimiterUnavailable) for x in results)
    assert len({id(x) for x in results}) == 20  # one exception object per caller
    assert time.monotonic() - t0 < 3.0  # bounded by the 0.5 s timeout (slack for a busy CI machine)
    with pytest.raises(LimiterUnavailable):
        await lim.settle(_lease(), 3)
    await lim.close()


def _lease():  # type: ignore[no-untyped-def]
    from gateway.ratelimit.base import lease_for

    return lease_for(plan(tpm=100, max_concurrency=1))


async def test_script_cache_flushed_scripts_are_loaded_again() -> None:
    from kit.localservices import start_redis_server

    # A Redis of its own: flushing the shared server's script cache would make other tests'
    # calls (in other workers) answer NOSCRIPT and be sent again, out of their order.
    own = start_redis_server()
    try:
        limiter = RedisLimiter(make_redis(own.url), prefix="flush:", timeout_s=10)
        assert (await limiter.admit(plan(rpm=10))).admitted
        r = make_redis(own.url)
        await r.script_flush()
        results = await asyncio.gather(*[limiter.admit(plan(rpm=10)) for _ in range(5)])
        assert [x.states[0].remaining for x in results] == [8, 7, 6, 5, 4]
        await r.aclose()
        await limiter.close()
    finally:
        own.stop()


async def test_killed_connection_is_replaced_transparently(limiter: RedisLimiter, redis_url: str) -> None:
    assert (await limiter.admit(plan(rpm=10))).admitted
    r = make_redis(redis_url)
    name = "lp-autopipe-victim"
    assert await limiter._pipe.execute("CLIENT", "SETNAME", name) == b"OK"  # on the pipeline's connection
    killed = await r.execute_command("CLIENT", "KILL", "SKIPME", "yes", "ID", await _client_id(r, name))
    assert killed == 1
    results = await asyncio.gather(*[limiter.admit(plan(rpm=10)) for _ in range(3)])
    assert [x.states[0].remaining for x in results] == [8, 7, 6]
    await r.aclose()


async def _client_id(r: aioredis.Redis, name: str) -> int:
    for c in await r.client_list():
        if c.get("name") == name:
            return int(c["id"])
    raise AssertionError("client not found")


async def test_cancelled_caller_is_left_out_of_the_batch(limiter: RedisLimiter) -> None:
    p = plan(rpm=1)
    task = asyncio.create_task(limiter.admit(p))
    await asyncio.sleep(0)  # queued, not sent yet
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert (await limiter.admit(p)).admitted  # the cancelled admission took nothing


# ------------------------------------------------------------------ a fake Redis on a socket


class FakeRedis:
    """Answers ``:1`` to every command (``+OK`` to redis-py's ``CLIENT SETINFO``); ``hang``: never
    answers; ``close_after``: closes each connection after answering that many commands. Records
    (connection number, command) of what it got."""

    def __init__(self, *, hang: bool = False, close_after: int | None = None) -> None:
        self.hang = hang
        self.close_after = close_after
        self.commands: list[tuple[int, bytes]] = []
        self.connections = 0
        self.server: asyncio.Server | None = None

    async def start(self) -> int:
        self.server = await asyncio.start_server(self._conn, "127.0.0.1", 0)
        return int(self.server.sockets[0].getsockname()[1])

    async def _conn(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        answered = 0
        self.connections += 1
        number = self.connections
        try:
            while True:
                line = await reader.readline()
                if not line:
                    return
                n = int(line[1:])
                parts = []
                for _ in range(n):
                    size = int((await reader.readline())[1:])
                    parts.append((await reader.readexactly(size + 2))[:-2])
                if parts[0].upper() == b"CLIENT":  # redis-py's CLIENT SETINFO on connect
                    writer.write(b"+OK\r\n")
                    continue
                self.commands.append((number, b" ".join(parts)))
                if self.hang:
                    continue
                writer.write(b":1\r\n")
                await writer.drain()
                answered += 1
                if self.close_after is not None and answered >= self.close_after:
                    return
        except (ConnectionError, asyncio.IncompleteReadError):
            return
        finally:
            writer.close()

    async def stop(self) -> None:
        assert self.server is not None
        self.server.close()


def _client(port: int) -> aioredis.Redis:
    return aioredis.Redis(port=port, protocol=2, socket_connect_timeout=1)  # RESP2: no HELLO


async def test_deadline_bounds_every_callers_wait() -> None:
    fake = FakeRedis(hang=True)
    r = _client(await fake.start())
    pipe = AutoPipeline(r, timeout_s=1.5)
    t0 = time.monotonic()
    first = pipe.execute("GET", "a")
    await asyncio.sleep(0.1)
    second = pipe.execute("GET", "b")  # queued behind the silent round trip
    out = await asyncio.gather(first, second, return_exceptions=True)
    elapsed = time.monotonic() - t0
    assert all(isinstance(x, RoundTripError) and "TimeoutError" in str(x) for x in out)
    # the second waited about its own timeout (1.6 s in all), not two (3.1 s); slack for a busy machine
    assert elapsed < 1.5 + 0.1 + 1.0
    await pipe.aclose()
    await r.aclose()
    await fake.stop()


async def test_broken_connection_resends_only_unanswered_calls() -> None:
    fake = FakeRedis(close_after=1)
    r = _client(await fake.start())
    pipe = AutoPipeline(r, timeout_s=5)
    got = await asyncio.gather(pipe.execute("INCR", "a"), pipe.execute("INCR", "b"))
    assert got == [1, 1]
    # "a" was answered before the connection closed: sent once; "b" again on a new connection
    assert fake.commands == [(1, b"INCR a"), (2, b"INCR b")]
    await pipe.aclose()
    await r.aclose()
    await fake.stop()


async def test_cancelling_close_fails_waiting_callers() -> None:
    fake = FakeRedis(hang=True)
    r = _client(await fake.start())
    pipe = AutoPipeline(r, timeout_s=30)
    fut = pipe.execute("GET", "a")
    await asyncio.sleep(0.05)
    await pipe.aclose()
    with pytest.raises(RoundTripError):
        await fut
    await r.aclose()
    await fake.stop()


async def test_limiter_usable_after_close_like_before(redis_url: str, redis_prefix: str) -> None:
    lim = RedisLimiter(make_redis(redis_url), prefix=redis_prefix, timeout_s=5)
    assert (await lim.admit(plan(rpm=10))).states[0].remaining == 9
    await lim.close()  # a gateway stopped ... and started again with the same limiter
    assert (await lim.admit(plan(rpm=10))).states[0].remaining == 8
    assert await lim.healthy()
    await lim.close()


async def test_redis_stopped_then_back(tmp_path: Path) -> None:
    """A Redis that goes away: LimiterUnavailable within the timeout, every caller; back (empty,
    no scripts): admissions work again without any restart of the limiter."""
    port = free_port()

    def start() -> ManagedProcess:
        proc = ManagedProcess(
            ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
             "--dir", str(tmp_path)],
            log_path=tmp_path / "redis.log", append_log=True,
        ).start()  # fmt: skip
        proc.wait_ready(tcp_ready("127.0.0.1", port, timeout=0.1), 15)
        return proc

    proc = start()
    lim = RedisLimiter(make_redis(f"redis://127.0.0.1:{port}/0"), timeout_s=0.5)
    try:
        assert (await lim.admit(plan(rpm=10))).states[0].remaining == 9
        proc.stop()
        t0 = time.monotonic()
        out = await asyncio.gather(*[lim.admit(plan(rpm=10)) for _ in range(5)], return_exceptions=True)
        assert all(isinstance(x, LimiterUnavailable) for x in out)
        assert time.monotonic() - t0 < 3.0  # bounded by the 0.5 s timeout (slack for a busy machine)
        proc = start()
        results = await asyncio.gather(*[lim.admit(plan(rpm=10)) for _ in range(3)])
        assert [r.states[0].remaining for r in results] == [9, 8, 7]  # a fresh store
    finally:
        await lim.close()
        proc.stop()


async def test_calls_made_while_a_reply_is_due_share_one_write(redis_url: str, redis_prefix: str) -> None:
    """Calls made in different loop steps while a write's reply is due go out together in one
    write once it is in, and each still gets its own reply, in order."""
    r = make_redis(redis_url)
    pipe = AutoPipeline(r, timeout_s=5)
    blocked = pipe.execute("BLPOP", f"{redis_prefix}never", "0.3")
    later = []
    for _ in range(3):
        await asyncio.sleep(0.02)
        later.append(pipe.execute("INCR", f"{redis_prefix}n"))
    await asyncio.sleep(0.05)
    assert pipe.round_trips == 1 and not blocked.done()  # the INCRs wait for the BLPOP's reply
    assert await blocked is None
    assert await asyncio.gather(*later) == [1, 2, 3]
    assert pipe.round_trips == 2  # all three in one write
    await pipe.aclose()
    await r.aclose()


async def test_protocol_error_fails_its_calls_and_the_next_call_reconnects() -> None:
    class Garbage(FakeRedis):
        async def _conn(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            self.connections += 1
            if self.connections == 1:
                await reader.readline()
                writer.write(b"?not resp\r\n")  # not a RESP type byte
                await writer.drain()
                await asyncio.sleep(1)
                writer.close()
                return
            await super()._conn(reader, writer)

    fake = Garbage()
    r = _client(await fake.start())
    pipe = AutoPipeline(r, timeout_s=5)
    with pytest.raises(RoundTripError, match="protocol error"):
        await pipe.execute("GET", "a")
    assert await pipe.execute("GET", "b") == 1  # a new connection
    await pipe.aclose()
    await r.aclose()
    await fake.stop()


async def test_connection_made_like_the_clients_password_db_and_name(tmp_path: Path) -> None:
    """AUTH (user and password), SELECT and CLIENT SETNAME from the client's URL, as redis-py
    sends them, over TCP and a Unix socket; a wrong password fails the calls, not the process."""
    port = free_port()
    sock = tmp_path / "redis.sock"
    proc = ManagedProcess(
        ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
         "--dir", str(tmp_path), "--requirepass", "s3cret", "--unixsocket", str(sock)],
        log_path=tmp_path / "redis.log",
    ).start()  # fmt: skip
    try:
        proc.wait_ready(tcp_ready("127.0.0.1", port, timeout=0.1), 15)
        urls = (
            f"redis://:s3cret@127.0.0.1:{port}/3?client_name=lp-limiter",
            f"redis://default:s3cret@127.0.0.1:{port}/3?client_name=lp-limiter",
            f"unix://{sock}?db=3&password=s3cret&client_name=lp-limiter",
        )
        for url in urls:
            r = aioredis.Redis.from_url(url)
            pipe = AutoPipeline(r, timeout_s=5)
            assert await pipe.execute("SET", "k", url) == b"OK"
            assert await pipe.execute("CLIENT", "GETNAME") == b"lp-limiter"
            assert await r.get("k") == url.encode()  # same database as the client's
            await pipe.aclose()
            await r.aclose()
        other_db = aioredis.Redis.from_url(f"redis://:s3cret@127.0.0.1:{port}/0")
        assert await other_db.get("k") is None
        await other_db.aclose()
        bad = aioredis.Redis.from_url(f"redis://:wrong@127.0.0.1:{port}/0")
        pipe = AutoPipeline(bad, timeout_s=5)
        with pytest.raises(RoundTripError, match=r"WRONGPASS|invalid"):
            await pipe.execute("GET", "k")
        await pipe.aclose()
        await bad.aclose()
    finally:
        proc.stop()


def test_under_uvloop_as_in_the_gateway(redis_url: str, redis_prefix: str) -> None:
    """The gateway runs on uvloop (its transports are not asyncio's classes): calls in one step,
    a database chosen by the URL (the handshake swaps the connection's protocol), a connection
    killed by the server and replaced."""
    import uvloop

    async def scenario() -> None:
        base = redis_url.rsplit("/", 1)[0] if redis_url.count("/") > 2 else redis_url
        r = aioredis.Redis.from_url(f"{base}/2")
        pipe = AutoPipeline(r, timeout_s=5)
        key = f"{redis_prefix}uv"
        got = await asyncio.gather(*[pipe.execute("INCR", key) for _ in range(50)])
        assert got == list(range(1, 51)) and pipe.round_trips == 1
        assert await r.get(key) == b"50"  # database 2, like the client
        assert await pipe.execute("CLIENT", "SETNAME", "lp-uv-victim") == b"OK"
        victim = next(c["id"] for c in await r.client_list() if c.get("name") == "lp-uv-victim")
        assert await r.execute_command("CLIENT", "KILL", "ID", victim) == 1
        assert await asyncio.gather(*[pipe.execute("INCR", key) for _ in range(3)]) == [51, 52, 53]
        await r.delete(key)
        await pipe.aclose()
        await r.aclose()

    uvloop.run(scenario())
