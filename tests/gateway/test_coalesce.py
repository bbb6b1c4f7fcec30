"""gateway.coalesce: an answer's head and body in one socket write; nothing held across a wait."""

from __future__ import annotations

import asyncio
import socket
import time
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from gateway.coalesce import CoalescingHttpToolsProtocol, CoalescingTransport
from gateway.serving import make_server, serve_all, wait_started
from kit.localservices import free_port


class FakeTransport:
    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.closed = False
        self.aborted = False

    def write(self, data: bytes) -> None:
        self.writes.append(bytes(data))

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.aborted = True

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return default

    def get_write_buffer_size(self) -> int:
        return 0


async def test_a_head_and_its_body_become_one_write_and_a_lone_head_goes_out_after_the_step() -> None:
    raw = FakeTransport()
    t = CoalescingTransport(raw, asyncio.get_running_loop())  # type: ignore[arg-type]
    t.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n")
    assert raw.writes == []  # a head: held
    t.write(b"ok")
    assert raw.writes == [b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok"]  # at once, one write
    await asyncio.sleep(0)
    assert len(raw.writes) == 1  # the scheduled flush finds nothing
    t.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
    assert t.get_write_buffer_size() > 0
    await asyncio.sleep(0)
    assert raw.writes[-1].startswith(b"HTTP/1.1 200")  # a lone head is not held past the step
    t.write(b"5\r\ndata:\r\n")  # a stream's chunk with nothing held: at once, not deferred
    assert raw.writes[-1] == b"5\r\ndata:\r\n" and len(raw.writes) == 3
    t.write(b"")
    await asyncio.sleep(0)
    assert len(raw.writes) == 3  # nothing written for nothing


async def test_close_writes_what_is_held_first_and_abort_drops_it() -> None:
    raw = FakeTransport()
    t = CoalescingTransport(raw, asyncio.get_running_loop())  # type: ignore[arg-type]
    t.write(b"HTTP/1.1 400 Bad\r\n\r\n")
    t.close()
    assert raw.writes == [b"HTTP/1.1 400 Bad\r\n\r\n"] and raw.closed
    raw2 = FakeTransport()
    t2 = CoalescingTransport(raw2, asyncio.get_running_loop())  # type: ignore[arg-type]
    t2.write(b"HTTP/1.1 200 OK\r\n\r\n")
    t2.abort()
    await asyncio.sleep(0)
    assert raw2.writes == [] and raw2.aborted


async def _app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] != "http":
        return
    if scope["path"] == "/slow":  # the head now, the body 0.5 s later
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"4")]})
        await asyncio.sleep(0.5)
        await send({"type": "http.response.body", "body": b"late"})
        return
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"5")]})
    await send({"type": "http.response.body", "body": b"hello"})


class CountingTransport:
    """The socket's transport, counting the writes that reach it (uvloop: one send() each)."""

    writes = 0

    def __init__(self, transport: asyncio.Transport) -> None:
        self._t = transport

    def write(self, data: bytes) -> None:
        CountingTransport.writes += 1
        self._t.write(data)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._t, name)


class CountedCoalescing(CoalescingHttpToolsProtocol):
    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(CountingTransport(transport))  # type: ignore[arg-type]


class CountedPlain(HttpToolsProtocol):
    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(CountingTransport(transport))  # type: ignore[arg-type]


def _read_answer(s: socket.socket, end: bytes) -> list[tuple[float, bytes]]:
    t0 = time.monotonic()
    got: list[tuple[float, bytes]] = []
    data = b""
    while not data.endswith(end):
        chunk = s.recv(65536)
        assert chunk, "connection closed"
        got.append((time.monotonic() - t0, chunk))
        data += chunk
    return got


def _client(port: int, n: int) -> list[tuple[float, bytes]]:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        for _ in range(n):
            s.sendall(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n")
            assert _read_answer(s, b"hello")[0][1].startswith(b"HTTP/1.1 200")
        s.sendall(b"GET /slow HTTP/1.1\r\nhost: x\r\n\r\n")
        return _read_answer(s, b"late")


async def _serve_and_count(
    protocol: type[HttpToolsProtocol], n: int
) -> tuple[int, list[tuple[float, bytes]]]:
    port = free_port()
    server = make_server(_app, "127.0.0.1", port, lifespan="off")
    server.config.http = protocol
    stop = asyncio.Event()
    task = asyncio.create_task(serve_all([server], stop))
    try:
        await wait_started([server])
        CountingTransport.writes = 0
        slow = await asyncio.to_thread(_client, port, n)
        return CountingTransport.writes, slow
    finally:
        stop.set()
        await task


async def test_through_a_real_server_one_write_per_answer_and_a_head_is_not_held() -> None:
    n = 50
    writes, slow = await _serve_and_count(CountedCoalescing, n)
    assert writes == n + 2, writes  # one per whole answer; the slow one: its head, then its body
    assert slow[0][1].startswith(b"HTTP/1.1 200") and not slow[0][1].endswith(b"late")
    assert slow[0][0] < 0.3  # the head went out at once, not with the body 0.5 s later
    assert slow[-1][0] >= 0.45
    plain_writes, _ = await _serve_and_count(CountedPlain, n)
    assert plain_writes == 2 * n + 2, plain_writes  # uvicorn alone: the head and the body apart
