"""A lean HTTP/1.1 client for the inference hot path: keep-alive connections per replica, one
socket write per request, the answer parsed by ``httptools`` (C, as uvicorn uses it).

Why not aiohttp here: a pooled ``ClientSession.post`` costs a request object, multidict headers,
a payload wrapper, tracing hooks, two timers and a connector round per call — about a quarter of
the gateway's CPU per request at 32 connections (py-spy). This client does only what the send
path needs, with the same behaviour towards the caller:

- at most ``max_per_host`` connections per replica (``max_connections_per_replica``); a request
  over the cap waits for one to be free, in order;
- connect timeout (``connect_timeout_s``); an idle connection is reused for ``keepalive_s``;
- ``total_s``: the whole exchange (headers and body) of a non-streamed answer; ``read_s``: the
  longest silence while a streamed answer is read (aiohttp's ``sock_read``);
- errors: :class:`ConnectError` (an ``OSError``: refused, unreachable, name not found),
  :class:`ConnectTimeout` (an ``OSError``),
  :class:`Disconnected` (``ConnectionResetError``: the replica closed the connection before or
  while answering), ``TimeoutError``; a malformed answer is a :class:`Disconnected` too;
- the answer's body is either read whole (:meth:`Response.read`) or as it arrives
  (``Response.content.iter_any()``, all the bytes available at each step, as aiohttp's);
- ``release()`` hands the connection back once the answer has been read to its end (if the
  end has not arrived yet, when it does); ``close()`` drops it (e.g. a client gone mid-stream:
  the replica sees the disconnect and stops generating).

Only plain ``http://`` URLs; the driver keeps aiohttp for anything else.
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Any, cast
from urllib.parse import urlsplit

import httptools

# Pause reading a streamed answer beyond this many unread bytes (resume when the reader caught up).
HIGH_WATER = 1 << 20


class ConnectError(OSError):
    """No connection to the replica (refused, unreachable, unknown host)."""


class ConnectTimeout(OSError):
    """The replica did not accept the connection within the connect timeout."""


class Disconnected(ConnectionResetError):
    """The replica closed the connection (or sent something that is not HTTP) before the end of
    the answer."""


def _check_header(value: str) -> str:
    if any(c in value for c in "\r\n\x00"):
        raise ValueError("header values must not contain CR, LF or NUL")
    return value


class _Target:
    """A replica URL parsed once: where to connect and the request head's fixed part."""

    __slots__ = ("host", "host_line", "key", "port", "prefix")

    def __init__(self, url: str) -> None:
        u = urlsplit(url)
        if u.scheme != "http" or not u.hostname:
            raise ValueError(f"not a plain http URL: {url!r}")
        self.host = u.hostname
        self.port = u.port or 80
        self.key = (self.host, self.port)
        self.prefix = u.path.rstrip("/")
        self.host_line = f"Host: {u.netloc}\r\n".encode("latin-1")


class _Body:
    """``response.content``: ``iter_any()`` yields what has arrived at each step."""

    __slots__ = ("_r",)

    def __init__(self, r: Response) -> None:
        self._r = r

    def iter_any(self) -> _Chunks:
        return _Chunks(self._r._conn)


class _Chunks:
    """An iterator object rather than an async generator: an abandoned generator costs the event
    loop a finalizer task."""

    __slots__ = ("_conn",)

    def __init__(self, conn: _Conn) -> None:
        self._conn = conn

    def __aiter__(self) -> _Chunks:
        return self

    async def __anext__(self) -> bytes:
        conn = self._conn
        while True:
            if conn.chunks:
                chunks = conn.chunks
                conn.chunks = []
                conn.buffered = 0
                conn.resume()
                return chunks[0] if len(chunks) == 1 else b"".join(chunks)
            if conn.complete:
                raise StopAsyncIteration
            await conn.wait()


class _Headers(dict[str, str]):
    """Answer headers by lower-case name; ``get`` ignores case like aiohttp's."""

    def get(self, key: str, default: Any = None) -> Any:  # type: ignore[override]
        return dict.get(self, key.lower(), default)


class Response:
    """One answer on one connection (see the module docstring)."""

    __slots__ = ("_closed", "_conn", "_released", "content", "headers", "status")

    def __init__(self, conn: _Conn, status: int, headers: _Headers) -> None:
        self._conn = conn
        self.status = status
        self.headers = headers
        self.content = _Body(self)
        self._released = False
        self._closed = False

    @property
    def closed(self) -> bool:
        return self._closed

    async def read(self) -> bytes:
        conn = self._conn
        conn.whole = True  # no pausing: the whole answer is wanted at once
        conn.resume()
        while not conn.complete:
            await conn.wait()
        chunks = conn.chunks
        conn.chunks = []
        conn.buffered = 0
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)

    def release(self) -> None:
        """The answer is read: back to the pool (at its end, if that has not arrived yet)."""
        if self._released or self._closed:
            return
        self._released = self._closed = True
        self._conn.done_with()

    def close(self) -> None:
        """Drop the connection (the answer is abandoned); nothing after ``release()``."""
        if self._closed:
            return
        self._closed = True
        self._conn.abort()


class _Conn(asyncio.Protocol):
    """One keep-alive connection and the answer it is receiving."""

    def __init__(self, pool: _HostPool) -> None:
        self.pool = pool
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.lost = False
        self.idle_since = 0.0
        # the current exchange
        self.busy = False
        self.headers: _Headers = _Headers()
        self.header_name = ""
        self.head_done = False
        self.status = 0
        self.keep_alive = False
        self.until_eof = False  # neither Content-Length nor chunked: the body ends with the connection
        self.complete = False
        self.chunks: list[bytes] = []
        self.buffered = 0
        self.paused = False
        self.whole = False  # read() is collecting the whole answer (never pause then)
        self.error: BaseException | None = None
        self.waiter: asyncio.Future[None] | None = None
        self.give_back = False  # released before the end of the answer
        self.timer: asyncio.TimerHandle | None = None
        self.deadline = 0.0  # total mode: fixed; read mode: last data + read_s
        self.read_s: float | None = None

    # ---------------------------------------------------------------- asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's are no subclass of asyncio's

    def data_received(self, data: bytes) -> None:
        if not self.busy:  # bytes nobody asked for: the connection is out of step
            self.abort()
            return
        if self.read_s is not None:
            self.deadline = self.pool.loop.time() + self.read_s
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as e:
            self._fail(Disconnected(f"malformed answer from the replica: {e}"))
            self.abort()
            return
        if self.buffered > HIGH_WATER and not self.paused and not self.whole and self.transport is not None:
            self.paused = True
            self.transport.pause_reading()

    def eof_received(self) -> bool | None:
        return None  # close the transport: connection_lost follows

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        self._stop_timer()
        if self.busy and not self.complete:
            if self.head_done and self.until_eof and exc is None:
                self.keep_alive = False
                self.on_message_complete()  # the end of a body delimited by the connection's end
            else:
                self._fail(Disconnected(f"the replica closed the connection{f': {exc}' if exc else ''}"))
        self.pool.forget(self)

    # ---------------------------------------------------------------- httptools callbacks

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers[name.decode("latin-1").lower()] = value.decode("latin-1")

    def on_headers_complete(self) -> None:
        p = self.parser
        self.status = p.get_status_code()
        self.keep_alive = p.should_keep_alive()
        h = self.headers
        self.until_eof = "content-length" not in h and "transfer-encoding" not in h and self.status >= 200
        self.head_done = True
        self._wake()

    def on_body(self, body: bytes) -> None:
        self.chunks.append(body)
        self.buffered += len(body)
        self._wake()

    def on_message_complete(self) -> None:
        self.complete = True
        self._stop_timer()
        self._wake()
        if self.give_back:
            self._finish()

    # ---------------------------------------------------------------- the exchange

    def start(self, request: bytes, total_s: float | None, read_s: float | None) -> None:
        self.busy = True
        self.headers = _Headers()
        self.head_done = self.complete = self.give_back = self.paused = self.until_eof = self.whole = False
        self.chunks = []
        self.buffered = 0
        self.error = None
        self.read_s = read_s
        loop = self.pool.loop
        limit = total_s if total_s is not None else read_s
        if limit is not None:
            self.deadline = loop.time() + limit
            self.timer = loop.call_at(self.deadline, self._on_timer)
        t = self.transport
        if t is None or t.is_closing():  # closed under us (its connection_lost not yet delivered)
            raise Disconnected("the replica closed the connection")
        try:
            t.write(request)
        except RuntimeError as e:  # uvloop: "unable to perform operation on … the handler is closed"
            raise Disconnected(f"the replica closed the connection: {e}") from e

    async def wait(self) -> None:
        """Until something new arrives (headers, body, end) or the exchange fails."""
        if self.error is not None:
            raise self.error
        fut = self.waiter = self.pool.loop.create_future()
        try:
            await fut
        finally:
            self.waiter = None
        if self.error is not None:
            raise self.error

    def _wake(self) -> None:
        w = self.waiter
        if w is not None and not w.done():
            w.set_result(None)

    def _fail(self, exc: BaseException) -> None:
        if self.error is None:
            self.error = exc
        w = self.waiter
        if w is not None and not w.done():
            w.set_exception(exc)

    def _on_timer(self) -> None:
        self.timer = None
        if self.complete or not self.busy:
            return
        now = self.pool.loop.time()
        if now < self.deadline:  # data came meanwhile (read mode): wait for the rest of the silence
            self.timer = self.pool.loop.call_at(self.deadline, self._on_timer)
            return
        self._fail(TimeoutError("the replica did not answer in time"))
        self.abort()

    def _stop_timer(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def resume(self) -> None:
        if self.paused and self.transport is not None and not self.lost:
            self.paused = False
            self.transport.resume_reading()

    def done_with(self) -> None:
        """The caller is done with the answer: reuse the connection once the answer has ended."""
        if self.complete:
            self._finish()
        else:
            self.give_back = True
            self.resume()

    def _finish(self) -> None:
        self.busy = False
        self.chunks = []
        self.buffered = 0
        if self.lost or not self.keep_alive or self.error is not None:
            self.abort()
            return
        self.pool.put_back(self)

    def abort(self) -> None:
        self._stop_timer()
        if not self.lost and self.transport is not None:
            self.transport.abort()  # connection_lost follows and forgets it
        self.lost = True
        self.pool.forget(self)


class _HostPool:
    """The connections to one replica (``host:port``)."""

    def __init__(self, client: Http1Client, target: _Target) -> None:
        self.client = client
        self.target = target
        self.loop = asyncio.get_running_loop()
        self.idle: list[_Conn] = []
        self.open: set[_Conn] = set()
        self.opening = 0
        self.waiters: deque[asyncio.Future[_Conn | None]] = deque()

    async def acquire(self) -> _Conn:
        keepalive = self.client.keepalive_s
        while True:
            idle = self.idle
            while idle:
                conn = idle.pop()
                t = conn.transport
                stale = self.loop.time() - conn.idle_since > keepalive
                if conn.lost or stale or t is None or t.is_closing():
                    conn.abort()
                    continue
                return conn
            if len(self.open) + self.opening < self.client.max_per_host:
                return await self._connect()
            fut: asyncio.Future[_Conn | None] = self.loop.create_future()
            self.waiters.append(fut)
            try:
                conn_or_none = await fut
            except BaseException:
                if not fut.done():
                    fut.cancel()
                elif not fut.cancelled():  # handed over just as we were cancelled: pass it on
                    given = fut.result()
                    if given is not None:
                        self.put_back(given)
                    else:
                        self._room()
                raise
            if conn_or_none is not None and not conn_or_none.lost:
                return conn_or_none
            # None: a connection closed, so there is room for a new one (loop and check)

    async def _connect(self) -> _Conn:
        t = self.target
        self.opening += 1
        try:
            _, conn = await asyncio.wait_for(
                self.loop.create_connection(lambda: _Conn(self), t.host, t.port),
                self.client.connect_s,
            )
        except TimeoutError as e:
            self._room()
            raise ConnectTimeout(f"connecting to {t.host}:{t.port} timed out") from e
        except OSError as e:
            self._room()
            raise ConnectError(f"cannot connect to {t.host}:{t.port}: {e}") from e
        except BaseException:
            self._room()
            raise
        finally:
            self.opening -= 1
        self.open.add(conn)
        return conn

    def put_back(self, conn: _Conn) -> None:
        while self.waiters:
            w = self.waiters.popleft()
            if not w.done():
                w.set_result(conn)
                return
        conn.idle_since = self.loop.time()
        self.idle.append(conn)

    def forget(self, conn: _Conn) -> None:
        if conn in self.open:
            self.open.discard(conn)
            if conn in self.idle:
                self.idle.remove(conn)
            self._room()

    def _room(self) -> None:
        """A connection closed (or failed to open): a waiter may open a new one."""
        while self.waiters:
            w = self.waiters.popleft()
            if not w.done():
                w.set_result(None)
                return

    def close(self) -> None:
        for conn in list(self.open):
            conn.abort()
        for w in self.waiters:
            if not w.done():
                w.cancel()
        self.waiters.clear()


class Http1Client:
    """POSTs with keep-alive connections, per replica; see the module docstring."""

    def __init__(
        self,
        *,
        connect_s: float = 2.0,
        max_per_host: int = 256,
        keepalive_s: float = 30.0,
        headers: dict[str, str] | None = None,
    ) -> None:
        self.connect_s = connect_s
        self.max_per_host = max_per_host if max_per_host > 0 else 1 << 30
        self.keepalive_s = keepalive_s
        self._fixed = b"".join(
            f"{_check_header(k)}: {_check_header(v)}\r\n".encode("latin-1")
            for k, v in (headers or {}).items()
        )
        self._targets: dict[str, _Target] = {}
        self._pools: dict[tuple[str, int], _HostPool] = {}
        self._loop: asyncio.AbstractEventLoop | None = None

    @staticmethod
    def handles(url: str) -> bool:
        """Plain ``http://`` without credentials in the URL (aiohttp turns those into basic auth)."""
        return url.startswith("http://") and "@" not in url.split("/", 3)[2]

    def _pool(self, url: str) -> tuple[_HostPool, _Target]:
        loop = asyncio.get_running_loop()
        if loop is not self._loop:  # first use, or a new event loop (tests): start afresh
            self._loop = loop
            self._pools = {}
        t = self._targets.get(url)
        if t is None:
            t = self._targets[url] = _Target(url)
        pool = self._pools.get(t.key)
        if pool is None:
            pool = self._pools[t.key] = _HostPool(self, t)
        return pool, t

    async def post(
        self,
        url: str,
        path: str,
        body: bytes,
        request_id: str,
        *,
        total_s: float | None = None,
        read_s: float | None = None,
    ) -> Response:
        """POST ``body`` (JSON) to ``url + path``; the answer once its headers are in."""
        pool, t = self._pool(url)
        head = (
            f"POST {t.prefix}{path} HTTP/1.1\r\nContent-Type: application/json\r\n"
            f"X-Request-Id: {_check_header(request_id)}\r\nContent-Length: {len(body)}\r\n"
        ).encode("latin-1")
        request = b"".join((head, t.host_line, self._fixed, b"\r\n", body))
        loop = pool.loop
        deadline = loop.time() + total_s if total_s is not None else None
        conn = await pool.acquire()
        try:
            if deadline is not None:
                total_s = deadline - loop.time()
                if total_s <= 0:
                    raise TimeoutError("the replica did not answer in time")
            conn.start(request, total_s, read_s)
            while not conn.head_done:
                await conn.wait()
        except BaseException:
            conn.abort()
            raise
        return Response(conn, conn.status, conn.headers)

    async def aclose(self) -> None:
        pools, self._pools = self._pools, {}
        for pool in pools.values():
            pool.close()
