"""The router's lean HTTP/1.1 client (``router.drivers.http1``) against a scripted asyncio server,
on asyncio's loop and on uvloop (the gateway's): keep-alive reuse, the per-replica cap, chunked
streams, the two timeouts, refused / dropped / malformed answers, and abandoning an answer."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

import pytest
import uvloop

from kit.procs import free_port
from router.drivers.http1 import ConnectError, Disconnected, Http1Client

Runner = Callable[[Coroutine[Any, Any, None]], None]
RUNNERS = [pytest.param(asyncio.run, id="asyncio"), pytest.param(uvloop.run, id="uvloop")]
Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]

OK = b'HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 11\r\n\r\n{"ok":true}'


class Server:
    """A scripted server: ``handler`` gets each connection; heads of the requests it read are kept."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.connections = 0
        self.heads: list[bytes] = []
        self.closed = asyncio.Event()
        self._server: asyncio.Server | None = None
        self.url = ""

    async def __aenter__(self) -> Server:
        async def on_conn(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            self.connections += 1
            try:
                await self.handler(r, w)
            finally:
                w.close()
                self.closed.set()

        self._server = await asyncio.start_server(on_conn, "127.0.0.1", 0)
        port = self._server.sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()

    async def read_request(self, r: asyncio.StreamReader) -> bytes:
        """One request (head + Content-Length body); b"" at EOF."""
        head = await r.readuntil(b"\r\n\r\n") if not r.at_eof() else b""
        if not head:
            return b""
        self.heads.append(head)
        length = next(
            int(line.split(b":")[1])
            for line in head.split(b"\r\n")
            if line.lower().startswith(b"content-length")
        )
        return await r.readexactly(length)


def serve_ok(srv_box: list[Server]) -> Handler:
    async def handler(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        while True:
            try:
                await srv_box[0].read_request(r)
            except asyncio.IncompleteReadError:
                return
            w.write(OK)
            await w.drain()

    return handler


@pytest.mark.parametrize("run", RUNNERS)
def test_keep_alive_reuses_one_connection_and_sends_the_head_once(run: Runner) -> None:
    async def main() -> None:
        box: list[Server] = []
        async with Server(serve_ok(box)) as srv:
            box.append(srv)
            client = Http1Client(headers={"Authorization": "Bearer k"})
            for i in range(3):
                resp = await client.post(srv.url, "/v1/chat/completions", b'{"a":1}', f"req-{i}", total_s=5)
                assert resp.status == 200
                assert resp.headers.get("Content-Type") == "application/json"
                assert await resp.read() == b'{"ok":true}'
                resp.release()
            assert srv.connections == 1
            head = srv.heads[2].decode()
            assert head.startswith("POST /v1/chat/completions HTTP/1.1\r\n")
            for line in (
                "X-Request-Id: req-2",
                "Content-Length: 7",
                "Authorization: Bearer k",
                "Host: 127.0.0.1:",
            ):
                assert f"\r\n{line}" in head
            await client.aclose()

    run(main())


@pytest.mark.parametrize("run", RUNNERS)
def test_answers_larger_than_the_read_buffer_arrive_whole_read_or_streamed(run: Runner) -> None:
    big = b"x" * (3 << 20)  # three times the level at which reading a stream pauses

    async def main() -> None:
        box: list[Server] = []

        async def handler(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            for _ in range(2):
                await box[0].read_request(r)
                w.write(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n%b" % (len(big), big))
                await w.drain()
            await r.read()

        async with Server(handler) as srv:
            box.append(srv)
            client = Http1Client()
            resp = await client.post(srv.url, "/x", b"{}", "w", total_s=10)
            await asyncio.sleep(0.2)  # the answer arrives while nobody reads yet
            assert await resp.read() == big
            resp.release()
            resp = await client.post(srv.url, "/x", b"{}", "s", read_s=10)
            got = bytearray()
            async for chunk in resp.content.iter_any():
                got += chunk
                await asyncio.sleep(0.001)  # a slow reader
            assert bytes(got) == big
            resp.release()
            assert srv.connections == 1
            await client.aclose()

    run(main())


@pytest.mark.parametrize("run", RUNNERS)
def test_over_the_cap_a_request_waits_for_a_free_connection(run: Runner) -> None:
    async def main() -> None:
        box: list[Server] = []
        async with Server(serve_ok(box)) as srv:
            box.append(srv)
            client = Http1Client(max_per_host=1)
            first = await client.post(srv.url, "/x", b"{}", "a", total_s=5)
            second = asyncio.create_task(client.post(srv.url, "/x", b"{}", "b", total_s=5))
            await asyncio.sleep(0.05)
            assert not second.done()  # the only connection is still in use
            await first.read()
            first.release()
            resp = await asyncio.wait_for(second, 5)
            assert await resp.read() == b'{"ok":true}'
            resp.release()
            assert srv.connections == 1
            await client.aclose()

    run(main())


@pytest.mark.parametrize("run", RUNNERS)
def test_a_chunked_stream_arrives_as_sent_and_the_connection_is_reused_after_its_end(run: Runner) -> None:
    async def main() -> None:
        box: list[Server] = []

        async def handler(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            await box[0].read_request(r)
            w.write(
                b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
            )
            for ev in (b"data: 1\n\n", b"data: [DONE]\n\n"):
                w.write(b"%x\r\n%b\r\n" % (len(ev), ev))
                await w.drain()
                await asyncio.sleep(0.05)
            w.write(b"0\r\n\r\n")
            await w.drain()
            await serve_ok(box)(r, w)  # then plain answers on the same connection

        async with Server(handler) as srv:
            box.append(srv)
            client = Http1Client()
            resp = await client.post(srv.url, "/s", b"{}", "s", read_s=5)
            got = []
            async for chunk in resp.content.iter_any():
                got.append(chunk)
                if chunk.endswith(b"[DONE]\n\n"):
                    resp.release()  # before the terminating chunk: handed back when it comes
            assert b"".join(got) == b"data: 1\n\ndata: [DONE]\n\n"
            again = await client.post(srv.url, "/x", b"{}", "n", total_s=5)
            assert await again.read() == b'{"ok":true}'
            again.release()
            assert srv.connections == 1
            await client.aclose()

    run(main())


@pytest.mark.parametrize("run", RUNNERS)
def test_no_answer_within_total_s_is_a_timeout_and_drops_the_connection(run: Runner) -> None:
    async def main() -> None:
        async def handler(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            await r.read()  # never answers; returns when the client drops the connection

        async with Server(handler) as srv:
            client = Http1Client()
            t0 = asyncio.get_running_loop().time()
            with pytest.raises(TimeoutError):
                await client.post(srv.url, "/x", b"{}", "t", total_s=0.2)
            assert asyncio.get_running_loop().time() - t0 < 2
            await asyncio.wait_for(srv.closed.wait(), 5)
            await client.aclose()

    run(main())


@pytest.mark.parametrize("run", RUNNERS)
def test_a_stream_silent_for_read_s_is_a_timeout_but_a_slow_one_is_not(run: Runner) -> None:
    async def main() -> None:
        box: list[Server] = []

        async def handler(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            await box[0].read_request(r)
            w.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
            for _ in range(4):  # 4 x 0.15 s: longer than read_s in all, never silent for read_s
                w.write(b"2\r\nok\r\n")
                await w.drain()
                await asyncio.sleep(0.15)
            await r.read()  # then silent

        async with Server(handler) as srv:
            box.append(srv)
            client = Http1Client()
            resp = await client.post(srv.url, "/s", b"{}", "s", read_s=0.4)
            got = b""
            with pytest.raises(TimeoutError):
                async for chunk in resp.content.iter_any():
                    got += chunk
            assert got == b"ok" * 4
            await client.aclose()

    run(main())


@pytest.mark.parametrize("run", RUNNERS)
def test_refused_dropped_and_malformed_answers_raise_oserrors(run: Runner) -> None:
    async def main() -> None:
        client = Http1Client()
        with pytest.raises(ConnectError):
            await client.post(f"http://127.0.0.1:{free_port()}", "/x", b"{}", "r", total_s=5)

        async def drop(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            await r.readuntil(b"\r\n\r\n")

        async with Server(drop) as srv:
            with pytest.raises(Disconnected):
                await client.post(srv.url, "/x", b"{}", "d", total_s=5)

        async def half(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            await r.readuntil(b"\r\n\r\n")
            w.write(b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\npartial")
            await w.drain()

        async with Server(half) as srv:
            resp = await client.post(srv.url, "/x", b"{}", "h", total_s=5)
            with pytest.raises(Disconnected):
                await resp.read()

        async def garbage(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            await r.readuntil(b"\r\n\r\n")
            w.write(b"SMTP ready\r\n\r\n")
            await w.drain()
            await r.read()

        async with Server(garbage) as srv:
            with pytest.raises(Disconnected):
                await client.post(srv.url, "/x", b"{}", "g", total_s=5)
        await client.aclose()

    run(main())


@pytest.mark.parametrize("run", RUNNERS)
def test_a_connection_the_server_closed_while_idle_is_not_reused(run: Runner) -> None:
    async def main() -> None:
        box: list[Server] = []

        async def once(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            await box[0].read_request(r)
            w.write(OK)
            await w.drain()  # then close (like a keep-alive timeout)

        async with Server(once) as srv:
            box.append(srv)
            client = Http1Client()
            for i in range(2):
                resp = await client.post(srv.url, "/x", b"{}", f"i{i}", total_s=5)
                assert await resp.read() == b'{"ok":true}'
                resp.release()
                await asyncio.sleep(0.1)  # the server's close reaches the client
            assert srv.connections == 2
            await client.aclose()

    run(main())


@pytest.mark.parametrize("run", RUNNERS)
def test_a_connection_closing_before_its_loss_is_delivered_is_not_written_to(run: Runner) -> None:
    """A replica killed mid-traffic: its pooled connections' transports close before their
    ``connection_lost`` runs. A request then opens a new connection instead of writing on the
    closing one (uvloop raises RuntimeError there: the gateway answered 500), and a connection
    handed out that closes under the caller fails as ``Disconnected`` (an OSError: retried)."""

    async def main() -> None:
        box: list[Server] = []
        async with Server(serve_ok(box)) as srv:
            box.append(srv)
            client = Http1Client()
            resp = await client.post(srv.url, "/x", b"{}", "a", total_s=5)
            assert await resp.read() == b'{"ok":true}'
            resp.release()
            pool, _ = client._pool(srv.url)
            [idle] = pool.idle
            assert idle.transport is not None
            idle.transport.close()  # closing; connection_lost comes on a later loop turn
            assert not idle.lost
            resp = await client.post(srv.url, "/x", b"{}", "b", total_s=5)  # no yield in between
            assert await resp.read() == b'{"ok":true}'
            resp.release()
            assert srv.connections == 2
            [conn] = pool.idle
            pool.idle.clear()
            assert conn.transport is not None
            conn.transport.close()
            with pytest.raises(Disconnected):
                conn.start(b"POST /x HTTP/1.1\r\n\r\n", 5.0, None)
            await client.aclose()

    run(main())


@pytest.mark.parametrize("run", RUNNERS)
def test_closing_an_answer_or_cancelling_the_caller_drops_the_connection(run: Runner) -> None:
    async def main() -> None:
        box: list[Server] = []
        eofs = 0

        async def endless(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            nonlocal eofs
            await box[0].read_request(r)
            w.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n2\r\nok\r\n")
            await w.drain()
            await r.read()  # until the client goes
            eofs += 1

        async with Server(endless) as srv:
            box.append(srv)
            client = Http1Client(max_per_host=1)
            resp = await client.post(srv.url, "/s", b"{}", "c", read_s=5)
            assert await resp.content.iter_any().__anext__() == b"ok"
            resp.close()
            resp.close()  # idempotent
            await asyncio.wait_for(srv.closed.wait(), 5)
            assert eofs == 1
            # the cap's one slot is free again
            again = await asyncio.wait_for(client.post(srv.url, "/s", b"{}", "x", read_s=5), 5)
            again.close()
            await client.aclose()

        silent_eof = asyncio.Event()

        async def silent(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            await r.read()
            silent_eof.set()

        async with Server(silent) as srv:
            client = Http1Client()
            task = asyncio.create_task(client.post(srv.url, "/s", b"{}", "y", total_s=30))
            await asyncio.sleep(0.1)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            await asyncio.wait_for(silent_eof.wait(), 5)
            await client.aclose()

    run(main())


def test_header_values_with_line_breaks_are_refused() -> None:
    with pytest.raises(ValueError):
        Http1Client(headers={"Authorization": "Bearer k\r\nX-Evil: 1"})

    async def main() -> None:
        with pytest.raises(ValueError):
            await Http1Client().post("http://127.0.0.1:9", "/x", b"{}", "id\r\nX-Evil: 1", total_s=1)

    asyncio.run(main())


def test_only_plain_http_urls_without_credentials_take_the_lean_client() -> None:
    assert Http1Client.handles("http://10.0.0.7:8000")
    assert Http1Client.handles("http://replica-0.vllm:8000/prefix")
    assert not Http1Client.handles("https://10.0.0.7:8000")
    assert not Http1Client.handles("http://user:secret@10.0.0.7:8000")
