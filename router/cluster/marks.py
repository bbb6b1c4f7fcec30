"""This process's side of the in-flight marks (``RedisCluster``): ``MarkBook`` keeps the counts,
the marks written to Redis with their tokens, and which of them may be released; ``RedisMarks``
writes, releases (in batches, by a flushing loop), re-asserts and says goodbye to them in Redis.

A mark is written to Redis when this process starts using an adapter on a replica (count
0 → 1) and nothing of ours is there yet; it is released ``linger_s`` after the count went back
to 0 (so back-to-back requests skip the round trip), by a conditional delete on its token, so
a release racing a newer mark of ours never deletes the newer one. Every heartbeat re-asserts
the live marks (so a restarted, empty Redis learns them again).
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable, Iterator

import redis.asyncio as aioredis
from redis.asyncio.client import Pipeline

from router.cluster import lua
from router.cluster.keys import Keys
from router.cluster.liveness import REDIS_ERRORS, Liveness

Key = tuple[str, str]  # (replica url, lora_name)


class MarkBook:
    def __init__(self, counts: dict[Key, int]) -> None:
        self.counts = counts  # requests in flight per key (shared with the in-process fallback)
        self._published: dict[Key, str] = {}  # marks written to Redis → their token
        self._idle_since: dict[Key, float] = {}  # count reached 0 at (wall)
        self._tokens = itertools.count(1)

    def take(self, key: Key) -> str | None:
        """Count one more use; the token to write when no mark of ours is live (else None)."""
        self._idle_since.pop(key, None)
        self.counts[key] = self.counts.get(key, 0) + 1
        return None if key in self._published else str(next(self._tokens))

    def written(self, key: Key, token: str) -> None:
        self._published[key] = token

    def give(self, key: Key, now: float) -> None:
        """One use ended; the mark starts lingering when none is left."""
        left = self.counts.get(key, 0) - 1
        if left > 0:
            self.counts[key] = left
            return
        self.counts.pop(key, None)
        if key in self._published:
            self._idle_since[key] = now

    def due(self, now: float, linger_s: float, *, force: bool = False) -> dict[str, list[str]]:
        """Marks to release now, per replica url: [field, token, field, token, …] (forgotten here)."""
        out: dict[str, list[str]] = {}
        for key, since in list(self._idle_since.items()):
            if (force or now - since >= linger_s) and self.counts.get(key, 0) == 0:
                del self._idle_since[key]
                token = self._published.pop(key, None)
                if token is not None:
                    out.setdefault(key[0], []).extend((key[1], token))
        return out

    def live(self) -> Iterator[tuple[Key, str]]:
        """Every mark written to Redis and not released (to re-assert or to say goodbye)."""
        return iter(list(self._published.items()))

    def clear(self) -> None:
        self._published.clear()
        self._idle_since.clear()


class RedisMarks:
    """The marks of ``live.pid`` in Redis (the caller falls back to its own rules while ``live.down``)."""

    def __init__(
        self,
        redis: aioredis.Redis,
        keys: Keys,
        live: Liveness,
        counts: dict[Key, int],
        *,
        linger_s: float,
        wall: Callable[[], float],
    ) -> None:
        self.book = MarkBook(counts)
        self._redis = redis
        self._keys = keys
        self._live = live
        self._linger_s = linger_s
        self._wall = wall
        self._mark = redis.register_script(lua.MARK)
        self._unmark = redis.register_script(lua.UNMARK)

    def in_flight(self, url: str, lora_name: str) -> int:
        """Requests of this process in flight for (url, lora_name)."""
        return self.book.counts.get((url, lora_name), 0)

    async def mark(self, url: str, lora_name: str) -> bool:
        key = (url, lora_name)
        token = self.book.take(key)
        if token is None:
            return True  # our mark is live: nobody can have started unloading it since
        try:
            ok = await self._mark(keys=self._keys.checked(url), args=[lora_name, self._live.pid, token])
        except REDIS_ERRORS as exc:
            self._live.failed(exc)
            return True
        if not ok:
            self.book.give(key, self._wall())
            return False
        self.book.written(key, token)
        return True

    def unmark(self, url: str, lora_name: str) -> None:
        self.book.give((url, lora_name), self._wall())

    async def flush(self, *, force: bool = False) -> None:
        """Release the marks whose adapter has had nothing in flight here for ``linger_s``."""
        by_url = self.book.due(self._wall(), self._linger_s, force=force)
        if not by_url or self._live.down:
            return
        pid = self._live.pid
        try:
            for url, pairs in by_url.items():
                args = [f"{v}|{pid}" if i % 2 == 0 else v for i, v in enumerate(pairs)]
                await self._unmark(keys=[self._keys.marks(url)], args=args)
        except REDIS_ERRORS as exc:
            self._live.failed(exc)

    async def flush_loop(self) -> None:
        while True:
            await asyncio.sleep(max(self._linger_s / 2, 0.05))
            await self.flush()

    async def reassert(self) -> None:
        """Write every live mark again (Redis may have restarted empty); raises what Redis raises."""
        live = list(self.book.live())
        if not live:
            return
        async with self._redis.pipeline(transaction=False) as pipe:
            for (url, lora), token in live:
                pipe.hset(self._keys.marks(url), f"{lora}|{self._live.pid}", token)
            await pipe.execute()

    def goodbye(self, pipe: Pipeline) -> None:
        """Queue the deletion of every live mark (the process is stopping)."""
        for (url, lora), _ in self.book.live():
            pipe.hdel(self._keys.marks(url), f"{lora}|{self._live.pid}")

    def clear(self) -> None:
        self.book.clear()
