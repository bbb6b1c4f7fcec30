"""Auto-pipelining for the limiter's Redis calls: many callers, one connection, one write at a
time.

The commands issued in one event-loop step go out in one socket write at the end of that step,
on one dedicated connection; commands issued while a write's replies are still coming are
written together as soon as the last of them is in (under load, one write and one Redis
wake-up carry many calls; alone, a call goes out at the end of its step). A reply is handed to
the oldest call still waiting (Redis answers a connection's commands in order). Each call stays
its own command — an ``EVALSHA`` of the limiter's Lua script is still atomic in Redis,
pipelining only shares the socket — and gets its own reply or its own error.

The connection is an :class:`asyncio.Protocol` feeding ``hiredis``'s reader (RESP2): no
per-reply coroutine, timeout context or stream buffer. It is opened from the settings of the
given redis-py client's pool (TCP, TLS or a Unix socket; AUTH, SELECT and the client name as
redis-py sends them; TCP keepalive as redis-py sets it, on by default since redis-py 8).
redis-py's ``health_check_interval`` (a PING before reusing an idle connection) has no
counterpart: a connection whose peer vanished is found by TCP keepalive while idle, else by the
first call's deadline (that call fails, the next one reconnects).

Failure handling:

- a connection that closes or breaks: the calls it had not answered are sent again on a new
  connection (at most ``resends`` times each, as redis-py's retry would); a connection that
  cannot be opened fails every call waiting for it with a :class:`RoundTripError` (a
  ``RedisError``);
- a protocol error, or a call left unanswered past its deadline (its start + ``timeout_s``):
  the connection is dropped (its replies would be out of step) and every call sent on it and
  not answered fails with a :class:`RoundTripError`; no caller waits longer than ``timeout_s``;
- an error reply (``ResponseError``) fails only the call it answers;
- ``NOSCRIPT`` (Redis lost its script cache): the scripts registered with
  :meth:`register_script` are loaded and only the calls that got ``NOSCRIPT`` are sent again
  (they did not run).

A caller that is cancelled before its command is written is left out of the write.
"""

from __future__ import annotations

import asyncio
import hashlib
import socket
from collections import deque
from collections.abc import Mapping
from typing import Any, cast

import hiredis
import redis.asyncio as aioredis
from redis.asyncio.connection import Connection, SSLConnection, UnixDomainSocketConnection
from redis.exceptions import NoScriptError, RedisError, ResponseError

Arg = str | bytes | int | float


def _keepalive(transport: asyncio.BaseTransport, options: Mapping[int, int | bytes]) -> None:
    """TCP keepalive with the client's options, as redis-py sets them on its own sockets (a
    peer that vanished without closing is found while the connection is idle)."""
    sock = transport.get_extra_info("socket")
    if sock is None:
        return
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for opt, value in options.items():
        sock.setsockopt(socket.IPPROTO_TCP, opt, value)


class RoundTripError(RedisError):
    """The connection carrying this call failed (connection, protocol, deadline)."""


def pack(args: tuple[Arg, ...]) -> bytes:
    """One command in RESP (an array of bulk strings), encoded as redis-py encodes arguments
    (hiredis's C packer: str as UTF-8, int/float by ``repr``, bytes as they are; bool refused)."""
    return hiredis.pack_command(args)  # type: ignore[arg-type]  # its stub says a 1-tuple


def _error(reply: Exception) -> ResponseError:
    msg = str(reply)
    return NoScriptError(msg) if msg.startswith("NOSCRIPT") else ResponseError(msg)


class _Call:
    __slots__ = ("cmd", "fut", "t0", "tries", "written")

    def __init__(self, cmd: bytes, fut: asyncio.Future[Any], t0: float) -> None:
        self.cmd = cmd
        self.fut = fut
        self.t0 = t0
        self.tries = 0  # writes so far
        self.written = 0  # the write (its number) that carried it last


class _Resp(asyncio.Protocol):
    """One connection: hands every complete reply to the pipeline, in order."""

    def __init__(self, pipe: AutoPipeline) -> None:
        self._pipe = pipe
        self._reader = hiredis.Reader()
        self.transport: asyncio.Transport | None = None
        self.lost: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass

    def data_received(self, data: bytes) -> None:
        reader = self._reader
        reader.feed(data)
        on_reply = self._pipe._on_reply
        try:
            while (reply := reader.gets()) is not False:
                on_reply(self, reply)
        except hiredis.ProtocolError as e:
            self._pipe._fail_connection(self, RoundTripError(f"protocol error: {e}"))
        self._pipe._replies_in()

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.lost.done():
            self.lost.set_result(None)
        self._pipe._on_lost(self, exc)


class AutoPipeline:
    """Sends the commands given to :meth:`execute` over one connection made like ``redis``'s."""

    def __init__(self, redis: aioredis.Redis, *, timeout_s: float, resends: int = 2) -> None:
        self._redis = redis
        self._timeout = timeout_s
        self._resends = resends
        self._scripts: dict[str, str] = {}  # sha1 → source, loaded again after NOSCRIPT
        self._loop: asyncio.AbstractEventLoop | None = None
        self._outbox: deque[_Call] = deque()  # not written yet
        self._inflight: deque[_Call | None] = deque()  # written, waiting for a reply (None: ours)
        self._conn: _Resp | None = None  # the open connection, handshake done
        self._opening: asyncio.Task[None] | None = None
        self._flush_handle: asyncio.Handle | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._writes = 0
        self._loaded_at = -1  # the write that carried the last SCRIPT LOADs
        self.round_trips = 0  # socket writes of commands (tests, metrics)

    def register_script(self, source: str) -> str:
        """Remember a Lua script (loaded again after ``NOSCRIPT``); returns its sha1 for EVALSHA."""
        sha = hashlib.sha1(source.encode()).hexdigest()
        self._scripts[sha] = source
        return sha

    def execute(self, *args: Arg) -> asyncio.Future[Any]:
        """Queue one command; the future gets its raw reply (bytes undecoded) or its error."""
        loop = asyncio.get_running_loop()
        if loop is not self._loop:
            self._bind(loop)
        fut = loop.create_future()
        self._outbox.append(_Call(pack(args), fut, loop.time()))
        if self._flush_handle is None:
            self._flush_handle = loop.call_soon(self._flush)
        return fut

    # ------------------------------------------------------------------ queueing and writing

    def _bind(self, loop: asyncio.AbstractEventLoop) -> None:
        """First use, or a new event loop (tests): forget what belonged to the old one."""
        self._loop = loop
        self._outbox = deque()
        self._inflight = deque()
        self._conn = None
        self._opening = None
        self._flush_handle = None
        self._timer = None

    def _flush(self) -> None:
        """End of the loop step: write every queued call (a cancelled caller is left out)."""
        self._flush_handle = None
        conn = self._conn
        if conn is None:
            if self._outbox and self._opening is None:
                assert self._loop is not None
                self._opening = self._loop.create_task(self._open())
            self._arm()
            return
        if self._inflight:
            return  # the next write goes when the replies of the last one are in
        calls = [c for c in self._outbox if not c.fut.done()]
        self._outbox.clear()
        if calls:
            self._write(conn, calls)

    def _write(self, conn: _Resp, calls: list[_Call]) -> None:
        assert conn.transport is not None
        self._writes += 1
        n = self._writes
        for c in calls:
            c.tries += 1
            c.written = n
        self._inflight.extend(calls)
        conn.transport.write(calls[0].cmd if len(calls) == 1 else b"".join(c.cmd for c in calls))
        self.round_trips += 1
        self._arm()

    # ------------------------------------------------------------------ replies

    def _on_reply(self, conn: _Resp, reply: Any) -> None:
        if conn is not self._conn or not self._inflight:
            return  # a connection given up on, or a reply nobody asked for: ignored
        call = self._inflight.popleft()
        if call is None:
            return  # one of our own commands (SCRIPT LOAD)
        if isinstance(reply, hiredis.ReplyError):
            err = _error(reply)
            if isinstance(err, NoScriptError) and self._scripts and call.tries <= self._resends:
                self._send_again_with_scripts(conn, call)
                return
            reply = err
        if call.fut.done():
            return  # its caller went away meanwhile
        if isinstance(reply, Exception):
            call.fut.set_exception(reply)
        else:
            call.fut.set_result(reply)

    def _replies_in(self) -> None:
        if not self._inflight and self._outbox and self._flush_handle is None:
            self._flush()

    def _send_again_with_scripts(self, conn: _Resp, call: _Call) -> None:
        """``call`` got NOSCRIPT: load the scripts (once for all calls written before the last
        load), then write it again."""
        assert conn.transport is not None
        if call.written > self._loaded_at:
            loads = [pack(("SCRIPT", "LOAD", src)) for src in self._scripts.values()]
            self._inflight.extend([None] * len(loads))
            conn.transport.write(b"".join(loads))
            self._loaded_at = self._writes + 1  # the write below, and every one before it
        self._write(conn, [call])

    # ------------------------------------------------------------------ failures and deadlines

    def _on_lost(self, conn: _Resp, exc: Exception | None) -> None:
        """The connection closed or broke: its unanswered calls are written again on a new one."""
        if conn is not self._conn:
            return
        self._conn = None
        todo = [c for c in self._inflight if c is not None and not c.fut.done()]
        self._inflight.clear()
        err = RoundTripError(f"connection lost: {exc or 'closed by the server'}")
        again = []
        for c in todo:
            if c.tries > self._resends:
                self._fail(c, err)
            else:
                again.append(c)
        self._outbox.extendleft(reversed(again))
        if self._outbox:
            self._flush()  # opens a new connection

    def _fail_connection(self, conn: _Resp, err: RoundTripError) -> None:
        """Give up on ``conn``: every call written on it and not answered fails with ``err``."""
        if conn is self._conn:
            self._conn = None
            for c in self._inflight:
                if c is not None:
                    self._fail(c, err)
            self._inflight.clear()
        if conn.transport is not None:
            conn.transport.abort()
        if self._outbox and self._flush_handle is None:
            self._flush()  # what waited behind it goes on a new connection

    @staticmethod
    def _fail(call: _Call, err: RoundTripError) -> None:
        if not call.fut.done():
            e = RoundTripError(str(err))  # one exception object per caller
            e.__cause__ = err.__cause__
            call.fut.set_exception(e)

    def _oldest(self) -> float | None:
        t = None
        for q in (self._inflight, self._outbox):
            for c in q:
                if c is not None:
                    t = c.t0 if t is None else min(t, c.t0)
                    break
        return t

    def _arm(self) -> None:
        if self._timer is None:
            oldest = self._oldest()
            if oldest is not None:
                assert self._loop is not None
                self._timer = self._loop.call_at(oldest + self._timeout, self._on_deadline)

    def _on_deadline(self) -> None:
        self._timer = None
        assert self._loop is not None
        now = self._loop.time()
        err = RoundTripError("TimeoutError: no answer from Redis within the timeout")
        head = next((c for c in self._inflight if c is not None), None)
        if head is not None and head.t0 + self._timeout <= now and self._conn is not None:
            self._fail_connection(self._conn, err)  # silent: whatever comes next is out of step
        while self._outbox and self._outbox[0].t0 + self._timeout <= now:
            self._fail(self._outbox.popleft(), err)  # waited its whole time for a connection
        self._arm()

    # ------------------------------------------------------------------ the connection

    async def _open(self) -> None:
        try:
            conn = await self._connect()
        except Exception as e:
            err = RoundTripError(f"{type(e).__name__}: {e}")
            err.__cause__ = e
            while self._outbox:  # everything waiting for this connection
                self._fail(self._outbox.popleft(), err)
            return
        finally:
            self._opening = None
        self._conn = conn
        if self._outbox:
            self._flush()

    async def _connect(self) -> _Resp:
        """A new connection like the pool's (address, TLS, AUTH, SELECT, client name), RESP2."""
        assert self._loop is not None
        pool = self._redis.connection_pool
        kw = pool.connection_kwargs
        cls = pool.connection_class
        connect_timeout = kw.get("socket_connect_timeout") or self._timeout
        async with asyncio.timeout(min(connect_timeout, self._timeout)):
            if issubclass(cls, UnixDomainSocketConnection):
                _t, conn = await self._loop.create_unix_connection(lambda: _Resp(self), kw["path"])
            else:
                like = cls(**kw)  # the pool's connection, not connected: its resolved settings
                ssl = like.ssl_context.get() if isinstance(like, SSLConnection) else None
                tr, conn = await self._loop.create_connection(
                    lambda: _Resp(self), kw.get("host", "localhost"), int(kw.get("port", 6379)), ssl=ssl
                )
                if isinstance(like, Connection) and like.socket_keepalive:
                    opts = like.socket_keepalive_options  # resolved by the class: a mapping
                    try:
                        _keepalive(tr, opts if isinstance(opts, Mapping) else {})
                    except (OSError, TypeError):  # options the socket refuses: no half-set connection
                        tr.abort()
                        raise
        hello: list[tuple[Arg, ...]] = []
        if kw.get("password") is not None:
            user = kw.get("username")
            hello.append(("AUTH", user, kw["password"]) if user else ("AUTH", kw["password"]))
        if kw.get("db"):
            hello.append(("SELECT", int(kw["db"])))
        if kw.get("client_name"):
            hello.append(("CLIENT", "SETNAME", kw["client_name"]))
        if hello:
            await self._handshake(conn, hello)
        return conn

    async def _handshake(self, conn: _Resp, cmds: list[tuple[Arg, ...]]) -> None:
        assert self._loop is not None and conn.transport is not None
        got: asyncio.Future[list[Any]] = self._loop.create_future()
        replies: list[Any] = []

        class _Hello(asyncio.Protocol):
            reader = hiredis.Reader()

            def data_received(self, data: bytes) -> None:
                self.reader.feed(data)
                while (r := self.reader.gets()) is not False:
                    replies.append(r)
                if len(replies) >= len(cmds) and not got.done():
                    got.set_result(replies)

            def connection_lost(self, exc: Exception | None) -> None:
                if not got.done():
                    got.set_exception(ConnectionError(f"closed during the handshake: {exc}"))

        conn.transport.set_protocol(_Hello())
        try:
            conn.transport.write(b"".join(pack(c) for c in cmds))
            async with asyncio.timeout(self._timeout):
                for r in await got:
                    if isinstance(r, hiredis.ReplyError):
                        raise _error(r)
        except BaseException:
            conn.transport.abort()
            raise
        conn.transport.set_protocol(conn)

    async def aclose(self) -> None:
        """Fail the calls in flight or queued and close the connection. Like a redis-py client,
        the pipeline stays usable: a later call connects again."""
        opening, self._opening = self._opening, None
        if opening is not None and not opening.done():
            opening.cancel()
            await asyncio.gather(opening, return_exceptions=True)
        if self._flush_handle is not None:
            self._flush_handle.cancel()
            self._flush_handle = None
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        err = RoundTripError("the rate-limit pipeline is closed")
        conn, self._conn = self._conn, None
        for c in [*self._inflight, *self._outbox]:
            if c is not None:
                self._fail(c, err)
        self._inflight.clear()
        self._outbox.clear()
        if conn is not None and conn.transport is not None:
            conn.transport.close()
            await asyncio.wait([conn.lost], timeout=1.0)
