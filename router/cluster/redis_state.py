"""``RedisCluster``: the cluster state of ``router.cluster.base`` shared through Redis.

Every read-modify-write is one Lua script (``router.cluster.lua``; key names in
``router.cluster.keys``). The hot path pays a round trip only when this process starts using an
adapter on a replica (its first in-flight request there, or the first after the mark's linger ran
out): see ``router.cluster.marks``.

Redis unreachable: every operation falls back to an in-process ``MemoryCluster`` (each process
decides alone: singleflight within the process only), logged once per transition; the heartbeat
keeps trying and the shared state is used again as soon as Redis answers (SPEC §18; see
``router.cluster.liveness``).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import orjson
import redis.asyncio as aioredis

from kit.aio import cancel_all
from router.cluster import lua
from router.cluster.base import Claim, LoadCaps, ReplicaShare
from router.cluster.keys import Keys
from router.cluster.liveness import REDIS_ERRORS, Liveness, new_pid
from router.cluster.marks import RedisMarks
from router.cluster.memory import GONE_TTL_S, NO_CAPS, MemoryCluster
from router.placement.types import Residency, ResidencyState


def parse_record(name: str, raw: bytes | str) -> Residency | None:
    try:
        d = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(d, dict) or not isinstance(d.get("state"), str):
        return None
    return Residency(
        lora_name=name,
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
    """``ClusterState`` through Redis: the residency records here; the process and chore leases
    and the down/recovered state in ``Liveness``, the in-flight marks in ``RedisMarks``."""

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
        self._keys = keys = Keys(prefix)
        self._wall = wall
        self._live = Liveness(redis, keys, self.pid, lease_s=lease_s)
        counts: dict[tuple[str, str], int] = {}  # this process's in-flight per (url, lora)
        self._local = MemoryCluster(self.pid, wall=wall, counts=counts)
        self._marks = RedisMarks(redis, keys, self._live, counts, linger_s=linger_s, wall=wall)
        self._tasks: list[asyncio.Task[None]] = []
        self._claim = redis.register_script(lua.CLAIM)
        self._begin_unload = redis.register_script(lua.BEGIN_UNLOAD)
        self._sync = redis.register_script(lua.SYNC)
        self._pool_of: dict[tuple[str, str], str] = {}  # loads of ours counted in a pool's cap

    @property
    def shared(self) -> bool:
        return not self._live.down

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        await self._live.beat(self._marks.reassert)
        self._tasks.append(
            asyncio.create_task(self._live.heartbeat_loop(self._marks.reassert), name="cluster-heartbeat")
        )
        self._tasks.append(asyncio.create_task(self._marks.flush_loop(), name="cluster-unmark"))

    async def stop(self) -> None:
        await cancel_all(self._tasks)
        self._tasks.clear()
        with contextlib.suppress(*REDIS_ERRORS):  # a goodbye: our marks and leases go at once
            async with self._redis.pipeline(transaction=False) as pipe:
                self._marks.goodbye(pipe)
                self._live.goodbye(pipe)
                await pipe.execute()
            await self._live.resign_all()
        self._marks.clear()

    # ------------------------------------------------------------------ marks, chores

    async def mark(self, url: str, lora_name: str) -> bool:
        if self._live.down:
            return await self._local.mark(url, lora_name)
        return await self._marks.mark(url, lora_name)

    def unmark(self, url: str, lora_name: str) -> None:
        self._marks.unmark(url, lora_name)

    async def flush_marks(self, *, force: bool = False) -> None:
        """Release the marks whose adapter has had nothing in flight here for ``linger_s``."""
        await self._marks.flush(force=force)

    async def lead(self, name: str) -> bool:
        return await self._live.lead(name)

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
        if self._live.down:
            return await self._local.claim(url, lora_name, max_adapters, candidates, since, caps)
        member = f"{url}|{lora_name}"
        args: list[Any] = [lora_name, max_adapters, self.pid, self._wall(), since]
        args += [caps.per_replica, caps.per_pool, 2 * self._live.lease_ms, member]
        args += [round(caps.turn_ttl_s * 1000), "1" if caps.background else "0", len(candidates), *candidates]
        keys = [*self._keys.checked(url), self._keys.loads(caps.pool), self._keys.turns(url)]
        try:
            out = await self._claim(keys=keys, args=args)
        except REDIS_ERRORS as exc:
            self._live.failed(exc)
            return await self._local.claim(url, lora_name, max_adapters, candidates, since, caps)
        kind = _s(out[0])
        if kind in ("present", "failed"):
            return Claim(kind, parse_record(lora_name, out[1]))  # type: ignore[arg-type]
        if kind == "full":
            return Claim("full")
        if kind == "busy":
            return Claim("busy", busy=_s(out[1]))
        if caps.per_pool:
            self._pool_of[(url, lora_name)] = caps.pool
        return Claim("reserved", evict=tuple(_s(v) for v in out[1:]))

    async def _load_over(self, url: str, lora_name: str) -> None:
        """The load of (url, lora_name) ended: it no longer counts against its pool's cap."""
        pool = self._pool_of.pop((url, lora_name), None)
        if pool is not None:
            await self._write(lambda: self._redis.zrem(self._keys.loads(pool), f"{url}|{lora_name}"))

    async def set_state(
        self,
        url: str,
        lora_name: str,
        state: ResidencyState,
        *,
        failure: str = "",
        retry_elsewhere: bool = True,
        reason: str = "",
        settling: bool = False,
    ) -> None:
        await self._local.set_state(
            url,
            lora_name,
            state,
            failure=failure,
            retry_elsewhere=retry_elsewhere,
            reason=reason,
            settling=settling,
        )
        rec: dict[str, Any] = {"state": state, "pid": self.pid, "ts": self._wall()}
        if state == "failed":
            rec.update(failure=failure, retry_elsewhere=retry_elsewhere, reason=reason[:200])
        if settling:
            rec["settling"] = True  # counted toward max_adapters, not toward loads in flight (lua.CLAIM)
        await self._write(lambda: self._redis.hset(self._keys.res(url), lora_name, orjson.dumps(rec)))
        if state not in ("staging", "loading") or settling:
            await self._load_over(url, lora_name)

    async def drop(self, url: str, lora_name: str) -> None:
        await self._local.drop(url, lora_name)
        await self._write(lambda: self._drop(url, lora_name))
        await self._load_over(url, lora_name)

    async def _drop(self, url: str, lora_name: str) -> None:
        """Delete the record and leave a tombstone (see ``lua.SYNC``) for ``GONE_TTL_S``."""
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.hdel(self._keys.res(url), lora_name)
            pipe.hset(self._keys.gone(url), lora_name, self._wall())
            pipe.expire(self._keys.gone(url), int(GONE_TTL_S))
            await pipe.execute()

    async def _write(self, op: Callable[[], Any]) -> None:
        if self._live.down:
            return
        try:
            await op()
        except REDIS_ERRORS as exc:
            self._live.failed(exc)

    async def record(self, url: str, lora_name: str) -> Residency | None:
        if self._live.down:
            return await self._local.record(url, lora_name)
        try:
            raw = await self._redis.hget(self._keys.res(url), lora_name)
        except REDIS_ERRORS as exc:
            self._live.failed(exc)
            return await self._local.record(url, lora_name)
        return parse_record(lora_name, raw) if raw else None

    async def begin_unload(self, url: str, lora_name: str) -> bool:
        if self._marks.in_flight(url, lora_name) > 0:
            return False
        if self._live.down:
            return await self._local.begin_unload(url, lora_name)
        try:
            args: list[Any] = [lora_name, self.pid, self._wall()]
            ok = await self._begin_unload(keys=self._keys.checked(url), args=args)
        except REDIS_ERRORS as exc:
            self._live.failed(exc)
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
        if self._live.down:
            return
        with contextlib.suppress(*REDIS_ERRORS):
            await self._sync(
                keys=[self._keys.res(url), self._keys.procs, self._keys.gone(url)],
                args=[self.pid, self._wall(), asked_at, len(names), *names],
            )

    async def read(self, urls: Sequence[str]) -> dict[str, ReplicaShare] | None:
        """Every replica's records and the live marks of other processes, in one round trip."""
        if self._live.down or not urls:
            return None
        try:
            async with self._redis.pipeline(transaction=False) as pipe:
                pipe.zrangebyscore(self._keys.procs, int(self._wall() * 1000), "+inf")
                for url in urls:
                    pipe.hgetall(self._keys.res(url))
                    pipe.hgetall(self._keys.marks(url))
                out = await pipe.execute()
        except REDIS_ERRORS as exc:
            self._live.failed(exc)
            return None
        live = {_s(p) for p in out[0]}
        shares: dict[str, ReplicaShare] = {}
        for i, url in enumerate(urls):
            recs: dict[str, Residency] = {}
            for name, raw in out[1 + 2 * i].items():
                rec = parse_record(_s(name), raw)
                if rec is not None:
                    recs[rec.lora_name] = rec
            remote: dict[str, int] = {}
            for f in out[2 + 2 * i]:
                lora, _, pid = _s(f).rpartition("|")
                if pid != self.pid and pid in live:
                    remote[lora] = remote.get(lora, 0) + 1
            shares[url] = ReplicaShare(recs, remote)
        return shares
