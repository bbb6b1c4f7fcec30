"""Auto-pipelining for the limiter's Redis calls: many callers, one round trip.

Every command issued while a round trip is in flight (or in the same event-loop turn) goes out
in the next one, on one dedicated connection: one socket write and one read for a whole batch of
admissions and settlements, instead of a pooled connection, a retry wrapper and a timeout each.
Each call stays its own command — an ``EVALSHA`` of the limiter's Lua script is still atomic in
Redis, pipelining only shares the socket — and gets its own reply or its own error, in order.

Failure handling, per batch:

- a connection error, a protocol error or running past the deadline fails every call of the
  batch with a :class:`RoundTripError` (a ``RedisError``) and drops the connection, which is
  reconnected by the next batch;
- an error reply (``ResponseError``) fails only the call it answers;
- ``NOSCRIPT`` (Redis lost its script cache): the scripts registered with :meth:`register_script`
  are loaded and only the calls that got ``NOSCRIPT`` are sent again (they did not run).

The deadline of a batch is its oldest call's start + ``timeout_s``, so no caller waits longer
than ``timeout_s`` for its answer, however many batches were queued before it. A caller that is
cancelled before its batch is written is left out of it.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
from collections import deque
from collections.abc import Callable
from functools import partial
from typing import Any

import hiredis
import redis.asyncio as aioredis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError, RedisError, ResponseError

Arg = str | bytes | int | float


class RoundTripError(RedisError):
    """The round trip carrying this call failed as a whole (connection, protocol, deadline)."""


def pack(args: tuple[Arg, ...]) -> bytes:
    """One command in RESP (an array of bulk strings), encoded as redis-py encodes arguments
    (hiredis's C packer: str as UTF-8, int/float by ``repr``, bytes as they are; bool refused)."""
    return hiredis.pack_command(args)  # type: ignore[arg-type]  # its stub says a 1-tuple


def _mark_sent(call: _Call) -> None:
    sent = call.sent
    if sent is not None and not sent.done():
        sent.set_result(None)


def _mark_all_sent(calls: list[_Call]) -> None:
    for call in calls:
        if call.sent is not None:
            _mark_sent(call)


class _Call:
    __slots__ = ("cmd", "fut", "sent", "t0")

    def __init__(
        self, cmd: bytes, fut: asyncio.Future[Any], t0: float, sent: asyncio.Future[None] | None = None
    ) -> None:
        self.cmd = cmd
        self.fut = fut
        self.t0 = t0
        self.sent = sent  # done once the command is written (or the call has failed)


class AutoPipeline:
    """Sends the commands given to :meth:`execute` in batches over one connection of ``redis``."""

    def __init__(
        self, redis: aioredis.Redis, *, timeout_s: float, max_batch: int = 512, resends: int = 2
    ) -> None:
        self._redis = redis
        self._timeout = timeout_s
        self._max_batch = max_batch
        self._resends = resends
        self._scripts: dict[str, str] = {}  # sha1 → source, loaded again after NOSCRIPT
        self._loop: asyncio.AbstractEventLoop | None = None
        self._queue: deque[_Call] = deque()
        self._worker: asyncio.Task[None] | None = None
        self._conn: Any = None  # redis.asyncio.connection.AbstractConnection, made on first use
        self.round_trips = 0  # batches sent (tests, metrics)

    def register_script(self, source: str) -> str:
        """Remember a Lua script (loaded again after ``NOSCRIPT``); returns its sha1 for EVALSHA."""
        sha = hashlib.sha1(source.encode()).hexdigest()
        self._scripts[sha] = source
        return sha

    def execute(self, *args: Arg) -> asyncio.Future[Any]:
        """Queue one command; the future gets its raw reply (bytes undecoded) or its error."""
        return self._queue_call(args, None)

    def execute_sent(self, *args: Arg) -> tuple[asyncio.Future[None], asyncio.Future[Any]]:
        """Like :meth:`execute`, plus a future done once the command is written on the connection
        (or has failed): every command any client sends Redis after that moment is executed after
        this one, since Redis runs commands in the order they reach it."""
        sent: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        return sent, self._queue_call(args, sent)

    def _queue_call(self, args: tuple[Arg, ...], sent: asyncio.Future[None] | None) -> asyncio.Future[Any]:
        loop = asyncio.get_running_loop()
        if loop is not self._loop:
            self._bind(loop)
        fut = loop.create_future()
        call = _Call(pack(args), fut, loop.time(), sent)
        if sent is not None:
            fut.add_done_callback(lambda _f: _mark_sent(call))  # failed or cancelled: not waiting
        self._queue.append(call)
        if self._worker is None:
            self._worker = loop.create_task(self._drain())
        return fut

    def _bind(self, loop: asyncio.AbstractEventLoop) -> None:
        """First use, or a new event loop (tests): forget what belonged to the old one."""
        self._loop = loop
        self._queue = deque()
        self._worker = None
        self._conn = None

    async def _drain(self) -> None:
        queue = self._queue
        try:
            while queue:
                batch: list[_Call] = []
                while queue and len(batch) < self._max_batch:
                    call = queue.popleft()
                    if not call.fut.done():  # a cancelled caller is left out
                        batch.append(call)
                if batch:
                    await self._round_trip(batch)
        finally:
            self._worker = None

    async def _round_trip(self, batch: list[_Call]) -> None:
        assert self._loop is not None
        deadline = batch[0].t0 + self._timeout
        replies: list[Any] = []  # in the order of ``batch``; may stop short on failure
        try:
            if self._loop.time() >= deadline:  # waited its whole timeout behind earlier batches
                raise TimeoutError("no answer from Redis within the timeout")
            async with asyncio.timeout_at(deadline):
                await self._send(batch, replies)
                missing = [i for i, r in enumerate(replies) if isinstance(r, NoScriptError)]
                if missing and self._scripts:
                    loads = [pack(("SCRIPT", "LOAD", src)) for src in self._scripts.values()]
                    loaded: list[Any] = []
                    await self._exchange(await self._connection(), loads, loaded)
                    for r in loaded:
                        if isinstance(r, Exception):
                            raise r
                    again: list[Any] = []
                    await self._send([batch[i] for i in missing], again)
                    for i, r in zip(missing, again, strict=True):
                        replies[i] = r
            self.round_trips += 1
        except BaseException as e:
            if not isinstance(e, ResponseError):  # e.g. past the deadline: replies may be out of step
                await self._drop_connection()
            for i, c in enumerate(batch):
                if c.fut.done():
                    continue
                if i < len(replies) and not isinstance(replies[i], NoScriptError):
                    self._answer(c, replies[i])  # answered before the failure
                else:
                    err = RoundTripError(f"{type(e).__name__}: {e}")
                    err.__cause__ = e
                    c.fut.set_exception(err)
            if not isinstance(e, Exception):
                raise  # cancelled (close) or exiting
            return
        for c, r in zip(batch, replies, strict=True):
            if not c.fut.done():
                self._answer(c, r)

    @staticmethod
    def _answer(call: _Call, reply: Any) -> None:
        if isinstance(reply, Exception):
            call.fut.set_exception(reply)
        else:
            call.fut.set_result(reply)

    async def _send(self, calls: list[_Call], replies: list[Any]) -> None:
        """One exchange of ``calls``; after a broken connection (Redis restarted, a stale socket),
        reconnect and send again the calls that got no reply yet, as redis-py's retry would."""
        for attempt in range(self._resends + 1):
            done = len(replies)
            try:
                conn = await self._connection()
                todo = calls[done:]
                await self._exchange(conn, [c.cmd for c in todo], replies, partial(_mark_all_sent, todo))
                return
            except (RedisConnectionError, OSError):
                await self._drop_connection()
                if attempt == self._resends:
                    raise

    async def _connection(self) -> Any:
        conn = self._conn
        if conn is None:
            pool = self._redis.connection_pool
            # No per-read/-write socket timeout (asyncio.wait_for and a timeout context per reply):
            # the batch's deadline bounds the whole exchange. No retry policy of the pool's either:
            # _send resends on a fresh connection itself (a refused connect must fail fast).
            kwargs = {**pool.connection_kwargs, "socket_timeout": None, "retry": None}
            conn = self._conn = pool.connection_class(**kwargs)
        if not conn.is_connected:
            await conn.connect()  # redis-py's connect: handshake, AUTH/SELECT
        return conn

    @staticmethod
    async def _exchange(
        conn: Any, cmds: list[bytes], out: list[Any], written: Callable[[], None] | None = None
    ) -> None:
        """Write ``cmds`` at once (then call ``written``), append one reply each to ``out`` (an error
        reply is appended, not raised). A connection failure raises, leaving in ``out`` the replies
        read before it."""
        await conn.send_packed_command(cmds[0] if len(cmds) == 1 else b"".join(cmds), check_health=False)
        if written is not None:
            written()
        for _ in cmds:
            try:
                out.append(await conn.read_response(disable_decoding=True))
            except ResponseError as e:
                out.append(e)

    async def _drop_connection(self) -> None:
        """After a failed round trip the replies may be out of step: start over on a new connection."""
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(Exception):
                await conn.disconnect(nowait=True)

    async def aclose(self) -> None:
        """Fail the calls in flight or queued and close the connection. Like a redis-py client,
        the pipeline stays usable: a later call connects again."""
        worker, self._worker = self._worker, None
        if worker is not None and not worker.done():
            worker.cancel()
            await asyncio.gather(worker, return_exceptions=True)
        while self._queue:
            c = self._queue.popleft()
            if not c.fut.done():
                c.fut.set_exception(RoundTripError("the rate-limit pipeline is closed"))
        await self._drop_connection()
