"""What the cluster shares besides residency: request counts per adapter, and the placement plan.

Every gateway process adds the requests it routed per lora_name to the **demand board**, in
time buckets of ``bucket_s`` seconds (wall clock); any process can sum the buckets of a span —
the whole cluster's counts, whichever gateway took the requests (issue 24.11: "measured hot"
and the placement controller's forecast are cluster-wide). The chore leader publishes the
**placement plan** (a JSON document) for every process to read.

``MemoryBoard`` keeps both in the process (one gateway: ``loraplane up``, and the fallback while
Redis is unreachable); ``RedisBoard`` shares them: one hash per bucket
(``<prefix>cl:demand:<bucket>``, lora_name → count, expiring after ``keep_s``) and one string
(``<prefix>cl:plan``, expiring after the TTL the leader gives).
"""

from __future__ import annotations

import logging
import math
import time
from collections import Counter
from collections.abc import Callable, Mapping
from typing import Protocol

import redis.asyncio as aioredis

from router.cluster.keys import Keys
from router.cluster.liveness import REDIS_ERRORS

log = logging.getLogger("loraplane.router.cluster")


class Board(Protocol):
    bucket_s: float

    def bucket(self, wall: float) -> int:
        """The bucket ``wall`` (seconds) falls in."""
        ...

    async def add(self, counts: Mapping[str, int], wall: float) -> None:
        """Add this process's ``counts`` to the bucket of ``wall``."""
        ...

    async def counts(self, first: int, last: int) -> dict[str, int]:
        """lora_name → requests over buckets ``first`` … ``last - 1``, every process together."""
        ...

    async def put_plan(self, doc: bytes, ttl_s: float) -> None: ...

    async def get_plan(self) -> bytes | None: ...


class MemoryBoard:
    def __init__(
        self, bucket_s: float = 1.0, keep_s: float = 300.0, wall: Callable[[], float] = time.time
    ) -> None:
        self.bucket_s = bucket_s
        self._keep = max(1, math.ceil(keep_s / bucket_s))
        self._buckets: dict[int, Counter[str]] = {}
        self._plan: tuple[bytes, float] | None = None
        self._wall = wall

    def bucket(self, wall: float) -> int:
        return math.floor(wall / self.bucket_s)

    async def add(self, counts: Mapping[str, int], wall: float) -> None:
        b = self.bucket(wall)
        self._buckets.setdefault(b, Counter()).update(counts)
        for old in [k for k in self._buckets if k < b - self._keep]:
            del self._buckets[old]

    async def counts(self, first: int, last: int) -> dict[str, int]:
        total: Counter[str] = Counter()
        for b in range(first, last):
            c = self._buckets.get(b)
            if c:
                total.update(c)
        return dict(total)

    async def put_plan(self, doc: bytes, ttl_s: float) -> None:
        self._plan = (doc, self._wall() + ttl_s)

    async def get_plan(self) -> bytes | None:
        if self._plan is None or self._plan[1] < self._wall():
            return None
        return self._plan[0]


class RedisBoard:
    """``Board`` in Redis; while Redis is unreachable, this process's own ``MemoryBoard``."""

    def __init__(
        self,
        redis: aioredis.Redis,
        prefix: str,
        *,
        bucket_s: float = 1.0,
        keep_s: float = 300.0,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self._redis = redis
        self._keys = Keys(prefix)
        self.bucket_s = bucket_s
        self._keep_s = keep_s
        self._local = MemoryBoard(bucket_s, keep_s, wall)
        self._down = False

    def bucket(self, wall: float) -> int:
        return self._local.bucket(wall)

    def _failed(self, exc: Exception) -> None:
        if not self._down:
            log.warning(
                "redis unreachable: demand counts and the plan are per process", extra={"error": str(exc)}
            )
        self._down = True

    def _ok(self) -> None:
        if self._down:
            log.info("redis reachable again: demand counts and the plan are shared")
        self._down = False

    async def add(self, counts: Mapping[str, int], wall: float) -> None:
        if not counts:
            return
        await self._local.add(counts, wall)
        key = self._keys.demand(self.bucket(wall))
        try:
            async with self._redis.pipeline(transaction=False) as pipe:
                for name, n in counts.items():
                    pipe.hincrby(key, name, n)
                pipe.expire(key, int(self._keep_s))
                await pipe.execute()
        except REDIS_ERRORS as exc:
            self._failed(exc)
            return
        self._ok()

    async def counts(self, first: int, last: int) -> dict[str, int]:
        if last <= first:
            return {}
        try:
            async with self._redis.pipeline(transaction=False) as pipe:
                for b in range(first, last):
                    pipe.hgetall(self._keys.demand(b))
                out = await pipe.execute()
        except REDIS_ERRORS as exc:
            self._failed(exc)
            return await self._local.counts(first, last)
        self._ok()
        total: Counter[str] = Counter()
        for h in out:
            for k, v in h.items():
                name = k.decode() if isinstance(k, bytes) else str(k)
                try:
                    total[name] += int(v)
                except ValueError:
                    continue
        return dict(total)

    async def put_plan(self, doc: bytes, ttl_s: float) -> None:
        await self._local.put_plan(doc, ttl_s)
        try:
            await self._redis.set(self._keys.plan, doc, px=max(1, int(ttl_s * 1000)))
        except REDIS_ERRORS as exc:
            self._failed(exc)
            return
        self._ok()

    async def get_plan(self) -> bytes | None:
        try:
            raw = await self._redis.get(self._keys.plan)
        except REDIS_ERRORS as exc:
            self._failed(exc)
            return await self._local.get_plan()
        self._ok()
        if raw is None:
            return None
        return raw if isinstance(raw, bytes) else str(raw).encode()
