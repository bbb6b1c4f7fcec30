"""The limiter's own Redis connection over TLS (``rediss://``, as managed Redis services with
in-transit encryption need), against a redis-server of the test's own started with TLS only
(certificates made by the ``openssl`` command for the test), and its TCP keepalive."""

from __future__ import annotations

import asyncio
import shutil
import socket
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis.asyncio as aioredis

from gateway.ratelimit import RedisLimiter, make_plan
from gateway.ratelimit.autopipe import AutoPipeline, RoundTripError
from kit.procs import ManagedProcess, free_port, tcp_ready
from kit.redis_factory import make_redis

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command")


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def _ca(d: Path, name: str) -> None:
    _openssl(
        "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
        "-keyout", f"{name}.key", "-out", f"{name}.crt", "-days", "2", "-subj", f"/CN={name}",
        cwd=d,
    )  # fmt: skip


@dataclass
class TlsRedis:
    port: int
    ca: Path  # the CA that signed the server's certificate
    other_ca: Path  # a CA that did not


@pytest.fixture(scope="module")
def tls_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TlsRedis]:
    d = tmp_path_factory.mktemp("redis-tls")
    _ca(d, "ca")
    _ca(d, "other-ca")
    _openssl(
        "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
        "-keyout", "server.key", "-out", "server.csr", "-subj", "/CN=localhost", cwd=d,
    )  # fmt: skip
    (d / "san.ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    _openssl(
        "x509", "-req", "-in", "server.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
        "-out", "server.crt", "-days", "2", "-extfile", "san.ext", cwd=d,
    )  # fmt: skip
    port = free_port()
    proc = ManagedProcess(
        ["redis-server", "--port", "0", "--tls-port", str(port), "--bind", "127.0.0.1",
         "--tls-cert-file", str(d / "server.crt"), "--tls-key-file", str(d / "server.key"),
         "--tls-ca-cert-file", str(d / "ca.crt"), "--tls-auth-clients", "no",
         "--requirepass", "s3cret", "--save", "", "--appendonly", "no", "--dir", str(d)],
        log_path=d / "redis.log",
    ).start()  # fmt: skip
    try:
        proc.wait_ready(tcp_ready("127.0.0.1", port, timeout=0.1), 15)
        yield TlsRedis(port, d / "ca.crt", d / "other-ca.crt")
    finally:
        proc.stop()


def _url(t: TlsRedis, ca: Path, extra: str = "") -> str:
    return f"rediss://:s3cret@127.0.0.1:{t.port}/4?ssl_ca_certs={ca}&ssl_cert_reqs=required{extra}"


def _keepalive_on(pipe: AutoPipeline) -> bool:
    conn = pipe._conn
    assert conn is not None and conn.transport is not None
    sock = conn.transport.get_extra_info("socket")
    return bool(sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE))


def _run_on_uvloop_and_asyncio(scenario) -> None:  # type: ignore[no-untyped-def]
    import uvloop

    uvloop.run(scenario())  # the gateway's loop
    asyncio.run(scenario())


def test_tls_connection_with_password_db_name_and_keepalive(tls_redis: TlsRedis) -> None:
    """Calls go over TLS to a TLS-only server, with the client's password, database and name;
    the calls of one step share one round trip as over plain TCP; keepalive as the URL asks."""
    url = _url(tls_redis, tls_redis.ca, "&client_name=lp-tls&socket_keepalive=true")

    async def scenario() -> None:
        r = aioredis.Redis.from_url(url)
        pipe = AutoPipeline(r, timeout_s=5)
        await r.delete("n")
        got = await asyncio.gather(*[pipe.execute("INCR", "n") for _ in range(40)])
        assert got == list(range(1, 41)) and pipe.round_trips == 1
        assert await pipe.execute("CLIENT", "GETNAME") == b"lp-tls"
        assert await r.get("n") == b"40"  # the client's database 4, over its own TLS connection
        assert _keepalive_on(pipe)
        await pipe.aclose()
        await r.aclose()

    _run_on_uvloop_and_asyncio(scenario)


def test_keepalive_as_redis_py_sets_it(tls_redis: TlsRedis, redis_url: str) -> None:
    """Keepalive on or off as the URL says; by default what the installed redis-py does on its
    own connections (on since redis-py 8); explicit options reach the socket."""
    from redis.asyncio.connection import Connection

    async def scenario() -> None:
        for extra, want in (("&socket_keepalive=false", False), ("", Connection().socket_keepalive)):
            r = aioredis.Redis.from_url(_url(tls_redis, tls_redis.ca, extra))
            pipe = AutoPipeline(r, timeout_s=5)
            assert await pipe.execute("PING") == b"PONG"
            assert _keepalive_on(pipe) == bool(want), extra
            await pipe.aclose()
            await r.aclose()
        base = aioredis.Redis.from_url(redis_url).connection_pool.connection_kwargs
        r = aioredis.Redis(
            host=base["host"], port=base["port"], socket_keepalive=True,
            socket_keepalive_options={socket.TCP_KEEPIDLE: 17, socket.TCP_KEEPCNT: 4},
        )  # fmt: skip
        pipe = AutoPipeline(r, timeout_s=5)
        assert await pipe.execute("PING") == b"PONG"
        assert _keepalive_on(pipe)
        assert pipe._conn is not None and pipe._conn.transport is not None
        sock = pipe._conn.transport.get_extra_info("socket")
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE) == 17
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT) == 4
        await pipe.aclose()
        await r.aclose()

    _run_on_uvloop_and_asyncio(scenario)


def test_a_server_certificate_from_another_ca_fails_the_calls_fast(tls_redis: TlsRedis) -> None:
    """A certificate the client does not trust: the waiting calls fail at once with the TLS
    error (no plaintext fallback, no wait for the deadline), and so does the next call."""

    async def scenario() -> None:
        r = aioredis.Redis.from_url(_url(tls_redis, tls_redis.other_ca))
        pipe = AutoPipeline(r, timeout_s=30)
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        results = await asyncio.gather(*[pipe.execute("PING") for _ in range(3)], return_exceptions=True)
        assert all(isinstance(e, RoundTripError) for e in results), results
        assert "CERTIFICATE_VERIFY_FAILED" in str(results[0]) or "certificate" in str(results[0]).lower()
        assert loop.time() - t0 < 10
        with pytest.raises(RoundTripError):
            await pipe.execute("PING")
        await pipe.aclose()
        await r.aclose()

    _run_on_uvloop_and_asyncio(scenario)


def test_the_limiter_admits_and_settles_over_tls(tls_redis: TlsRedis) -> None:
    """The gateway's limiter built as the gateway builds it (``make_redis`` on a ``rediss://``
    URL): the Lua scripts load and run over TLS; a concurrency cap of 2 holds; settling frees."""

    async def scenario() -> None:
        lim = RedisLimiter(make_redis(_url(tls_redis, tls_redis.ca)), prefix="lp-tls-test:", timeout_s=5)
        plan = make_plan(tenant_id="t-tls", rpm=None, tpm=None, max_concurrency=2, estimated_tokens=10)
        first = [await lim.admit(plan) for _ in range(3)]
        assert [a.admitted for a in first] == [True, True, False]
        lease = first[0].lease
        assert lease is not None
        await lim.settle(lease, 10)
        again = await lim.admit(plan)
        assert again.admitted
        for a in (first[1], again):
            assert a.lease is not None
            await lim.settle(a.lease, 10)
        await lim.close()

    import uvloop

    uvloop.run(scenario())


def test_keepalive_options_the_socket_refuses_fail_the_calls() -> None:
    """An option the kernel does not know: the calls fail with the error (as redis-py refuses
    such a connection) and the connection is closed, not left open; the next call tries again."""

    async def scenario() -> None:
        live: set[asyncio.StreamWriter] = set()

        async def conn(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            live.add(writer)
            try:
                await reader.read()  # until the client closes
            finally:
                live.discard(writer)
                writer.close()

        server = await asyncio.start_server(conn, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        r = aioredis.Redis(
            host="127.0.0.1", port=port, protocol=2, socket_keepalive=True, socket_keepalive_options={9999: 1}
        )
        pipe = AutoPipeline(r, timeout_s=5)
        for _ in range(2):
            with pytest.raises(RoundTripError, match="Errno"):
                await pipe.execute("PING")
        for _ in range(100):
            if not live:
                break
            await asyncio.sleep(0.02)
        assert not live  # both refused connections were closed
        await pipe.aclose()
        await r.aclose()
        server.close()

    _run_on_uvloop_and_asyncio(scenario)
