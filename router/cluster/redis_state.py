"""``RedisCluster``: the cluster state of ``router.cluster.base`` shared through Redis.

Every read-modify-write is one Lua script (``router.cluster.lua``). The hot path pays a round
trip only when this process starts using an adapter on a replica (its first in-flight request
there, or the first after the mark's linger ran out); marks are released in batches after
``linger_s`` and re-asserted on every heartbeat (so a restarted, empty Redis learns them again).

Redis unreachable: every operation falls back to an in-process ``MemoryCluster`` (each process
decides alone: singleflight within the process only), logged once per transition; the heartbeat
keeps trying and the shared state is used again as soon as Redis answers (SPEC §18).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import orjson
import redis.asyncio as aioredis
from redis.exceptions import RedisError

from kit.aio import cancel_all
from router.cluster import lua
from router.cluster.base import Claim, LoadCaps, ReplicaShare, SharedRecord
from router.cluster.marks import MarkBook
from router.cluster.memory import GONE_TTL_S, NO_CAPS, MemoryCluster
from router.placement.types import ResidencyState

log = logging.getLogger("loraplane.router.cluster")


def new_pid() -> str:
    return f"{socket.gethostname()[:40]}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


def parse_record(raw: bytes | str) -> SharedRecord | None:
    try:
        d = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(d, dict) or not isinstance(d.get("state"), str):
        return None
    return SharedRecord(
        state=d["state"],
        pid=str(d.get("pid") or ""),
        ts=float(d.get("ts") or 0.0),
        failure=str(d.get("failure") or ""),
        retry_elsewhere=bool(d.get("retry_elsewhere", True)),
        reason=str(d.get("reason") or ""),
    )


def _s(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


class RedisCluster:
    def __init__(
        self,
        redis: aioredis.Redis,
        prefix: str,
        *,
        lease_s: float = 30.0,
        linger_s: float = 2.0,
        pid: str | None = None,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.pid = pid or new_pid()
        self._redis = redis
        self._p = prefix
        self._lease_ms = int(lease_s * 1000)
        self._linger_s = linger_s
        self._wall = wall
        self._down = False
        counts: dict[tuple[str, str], int] = {}  # this process's in-flight per (url, lora)
        self._local = MemoryCluster(self.pid, wall=wall, counts=counts)
        self._marks_book = MarkBook(counts)
        self._tasks: list[asyncio.Task[None]] = []
        r = redis
        self._mark = r.register_script(lua.MARK)
        self._unmark = r.register_script(lua.UNMARK)
        self._claim = r.register_script(lua.CLAIM)
        self._begin_unload = r.register_script(lua.BEGIN_UNLOAD)
        self._sync = r.register_script(lua.SYNC)
        self._heartbeat = r.register_script(lua.HEARTBEAT)
        self._lead = r.register_script(lua.LEAD)
        self._resign = r.register_script(lua.RESIGN)
        self._leading: set[str] = set()
        self._pool_of: dict[tuple[str, str], str] = {}  # loads of ours counted in a pool's cap

    # ------------------------------------------------------------------ keys

    def _res(self, url: str) -> str:
        return f"{self._p}cl:res:{url}"

    def _marks(self, url: str) -> str:
        return f"{self._p}cl:mark:{url}"

    def _gone(self, url: str) -> str:
        return f"{self._p}cl:gone:{url}"

    @property
    def _procs(self) -> str:
        return f"{self._p}cl:procs"

    # ------------------------------------------------------------------ health of the shared store

    @property
    def shared(self) -> bool:
        return not self._down

    def _failed(self, exc: Exception) -> None:
        if not self._down:
            self._down = True
            log.error(
                "redis unreachable: cluster state is per process until it is back "
                "(loads are singleflight within this process only)",
                extra={"error": str(exc)},
            )

    def _recovered(self) -> None:
        if self._down:
            self._down = False
            log.warning("redis reachable again: cluster state shared again")

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        await self._beat()
        self._tasks.append(asyncio.create_task(self._heartbeat_loop(), name="cluster-heartbeat"))
        self._tasks.append(asyncio.create_task(self._flush_loop(), name="cluster-unmark"))

    async def stop(self) -> None:
        await cancel_all(self._tasks)
        self._tasks.clear()
        with contextlib.suppress(RedisError, OSError):  # a goodbye: our marks and leases go at once
            async with self._redis.pipeline(transaction=False) as pipe:
                for (url, lora), _ in self._marks_book.live():
                    pipe.hdel(self._marks(url), f"{lora}|{self.pid}")
                pipe.zrem(self._procs, self.pid)
                await pipe.execute()
            for name in list(self._leading):
                await self._resign(keys=[f"{self._p}cl:lead:{name}"], args=[self.pid])
        self._marks_book.clear()

    async def _beat(self) -> None:
        try:
            await self._heartbeat(keys=[self._procs], args=[self.pid, self._lease_ms])
            live = list(self._marks_book.live())
            if live:  # re-assert (Redis may have restarted empty)
                async with self._redis.pipeline(transaction=False) as pipe:
                    for (url, lora), token in live:
                        pipe.hset(self._marks(url), f"{lora}|{self.pid}", token)
                    await pipe.execute()
        except (RedisError, OSError) as exc:
            self._failed(exc)
            return
        self._recovered()

    async def _heartbeat_loop(self) -> None:
        period = max(self._lease_ms / 3000.0, 0.05)
        while True:
            await asyncio.sleep(period if not self._down else min(period, 1.0))
            await self._beat()

    async def _flush_loop(self) -> None:
        while True:
            await asyncio.sleep(max(self._linger_s / 2, 0.05))
            await self.flush_marks()

    async def flush_marks(self, *, force: bool = False) -> None:
        """Release the marks whose adapter has had nothing in flight here for ``linger_s``."""
        by_url = self._marks_book.due(self._wall(), self._linger_s, force=force)
        if not by_url or self._down:
            return
        try:
            for url, pairs in by_url.items():
                args = [f"{v}|{self.pid}" if i % 2 == 0 else v for i, v in enumerate(pairs)]
                await self._unmark(keys=[self._marks(url)], args=args)
        except (RedisError, OSError) as exc:
            self._failed(exc)

    # ------------------------------------------------------------------ marks

    async def mark(self, url: str, lora_name: str) -> bool:
        if self._down:
            return await self._local.mark(url, lora_name)
        key = (url, lora_name)
        token = self._marks_book.take(key)
        if token is None:
            return True  # our mark is live: nobody can have started unloading it since
        try:
            ok = await self._mark(
                keys=[self._res(url), self._marks(url), self._procs], args=[lora_name, self.pid, token]
            )
        except (RedisError, OSError) as exc:
            self._failed(exc)
            return True
        if not ok:
            self._marks_book.give(key, self._wall())
            return False
        self._marks_book.written(key, token)
        return True

    def unmark(self, url: str, lora_name: str) -> None:
        self._marks_book.give((url, lora_name), self._wall())

    # ------------------------------------------------------------------ residency

    async def claim(
        self,
        url: str,
        lora_name: str,
        max_adapters: int,
        candidates: Sequence[str],
        since: float,
        caps: LoadCaps = NO_CAPS,
    ) -> Claim:
        if self._down:
            return await self._local.claim(url, lora_name, max_adapters, candidates, since, caps)
        member = f"{url}|{lora_name}"
        args: list[Any] = [lora_name, max_adapters, self.pid, self._wall(), since]
        args += [caps.per_replica, caps.per_pool, 2 * self._lease_ms, member, len(candidates), *candidates]
        keys = [self._res(url), self._marks(url), self._procs, self._pool_key(caps.pool)]
        try:
            out = await self._claim(keys=keys, args=args)
        except (RedisError, OSError) as exc:
            self._failed(exc)
            return await self._local.claim(url, lora_name, max_adapters, candidates, since, caps)
        kind = _s(out[0])
        if kind in ("present", "failed"):
            return Claim(kind, parse_record(out[1]))  # type: ignore[arg-type]
        if kind == "full":
            return Claim("full")
        if kind == "busy":
            return Claim("busy", busy=_s(out[1]))
        if caps.per_pool:
            self._pool_of[(url, lora_name)] = caps.pool
        return Claim("reserved", evict=tuple(_s(v) for v in out[1:]))

    def _pool_key(self, pool: str) -> str:
        return f"{self._p}cl:loads:{pool}"

    async def _load_over(self, url: str, lora_name: str) -> None:
        """The load of (url, lora_name) ended: it no longer counts against its pool's cap."""
        pool = self._pool_of.pop((url, lora_name), None)
        if pool is not None:
            await self._write(lambda: self._redis.zrem(self._pool_key(pool), f"{url}|{lora_name}"))

    async def set_state(
        self,
        url: str,
        lora_name: str,
        state: ResidencyState,
        *,
        failure: str = "",
        retry_elsewhere: bool = True,
        reason: str = "",
    ) -> None:
        await self._local.set_state(
            url, lora_name, state, failure=failure, retry_elsewhere=retry_elsewhere, reason=reason
        )
        rec: dict[str, Any] = {"state": state, "pid": self.pid, "ts": self._wall()}
        if state == "failed":
            rec.update(failure=failure, retry_elsewhere=retry_elsewhere, reason=reason[:200])
        await self._write(lambda: self._redis.hset(self._res(url), lora_name, orjson.dumps(rec)))
        if state not in ("staging", "loading"):
            await self._load_over(url, lora_name)

    async def drop(self, url: str, lora_name: str) -> None:
        await self._local.drop(url, lora_name)
        await self._write(lambda: self._drop(url, lora_name))
        await self._load_over(url, lora_name)

    async def _drop(self, url: str, lora_name: str) -> None:
        """Delete the record and leave a tombstone (see ``lua.SYNC``) for ``GONE_TTL_S``."""
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.hdel(self._res(url), lora_name)
            pipe.hset(self._gone(url), lora_name, self._wall())
            pipe.expire(self._gone(url), int(GONE_TTL_S))
            await pipe.execute()

    async def _write(self, op: Callable[[], Any]) -> None:
        if self._down:
            return
        try:
            await op()
        except (RedisError, OSError) as exc:
            self._failed(exc)

    async def record(self, url: str, lora_name: str) -> SharedRecord | None:
        if self._down:
            return await self._local.record(url, lora_name)
        try:
            raw = await self._redis.hget(self._res(url), lora_name)
        except (RedisError, OSError) as exc:
            self._failed(exc)
            return await self._local.record(url, lora_name)
        return parse_record(raw) if raw else None

    async def begin_unload(self, url: str, lora_name: str) -> bool:
        if self._marks_book.counts.get((url, lora_name), 0) > 0:
            return False
        if self._down:
            return await self._local.begin_unload(url, lora_name)
        try:
            ok = await self._begin_unload(
                keys=[self._res(url), self._marks(url), self._procs], args=[lora_name, self.pid, self._wall()]
            )
        except (RedisError, OSError) as exc:
            self._failed(exc)
            return await self._local.begin_unload(url, lora_name)
        if ok:
            await self._local.set_state(url, lora_name, "unloading")
        return bool(ok)

    async def end_unload(self, url: str, lora_name: str, ok: bool) -> None:
        if ok:
            await self.drop(url, lora_name)
        else:
            await self.set_state(url, lora_name, "resident")

    async def sync_models(self, url: str, listed: Iterable[str], asked_at: float) -> None:
        names = list(listed)
        await self._local.sync_models(url, names, asked_at)
        if self._down:
            return
        with contextlib.suppress(RedisError, OSError):
            await self._sync(
                keys=[self._res(url), self._procs, self._gone(url)],
                args=[self.pid, self._wall(), asked_at, len(names), *names],
            )

    async def read(self, urls: Sequence[str]) -> dict[str, ReplicaShare] | None:
        """Every replica's records and the live marks of other processes, in one round trip."""
        if self._down or not urls:
            return None
        try:
            async with self._redis.pipeline(transaction=False) as pipe:
                pipe.zrangebyscore(self._procs, int(self._wall() * 1000), "+inf")
                for url in urls:
                    pipe.hgetall(self._res(url))
                    pipe.hgetall(self._marks(url))
                out = await pipe.execute()
        except (RedisError, OSError) as exc:
            self._failed(exc)
            return None
        live = {_s(p) for p in out[0]}
        shares: dict[str, ReplicaShare] = {}
        for i, url in enumerate(urls):
            recs: dict[str, SharedRecord] = {}
            for name, raw in out[1 + 2 * i].items():
                rec = parse_record(raw)
                if rec is not None:
                    recs[_s(name)] = rec
            remote: dict[str, int] = {}
            for f in out[2 + 2 * i]:
                lora, _, pid = _s(f).rpartition("|")
                if pid != self.pid and pid in live:
                    remote[lora] = remote.get(lora, 0) + 1
            shares[url] = ReplicaShare(recs, remote)
        return shares

    async def lead(self, name: str) -> bool:
        if self._down:
            return True  # alone: do the chore here (SPEC §18: recover without a restart)
        try:
            got = bool(await self._lead(keys=[f"{self._p}cl:lead:{name}"], args=[self.pid, self._lease_ms]))
        except (RedisError, OSError) as exc:
            self._failed(exc)
            return True
        if got:
            self._leading.add(name)
        else:
            self._leading.discard(name)
        return got
