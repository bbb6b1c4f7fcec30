"""This process's standing in the cluster (``RedisCluster``): whether Redis answers, its
liveness lease, and the chore-leader leases it holds.

``Liveness.down`` is the one down/recovered state every part consults: a failed Redis call
reports it (``failed``), a successful heartbeat clears it (``recovered``), each transition
logged once. The heartbeat renews the lease every ``lease_s``/3 (every second at most while
Redis is down, so the shared state is used again soon after it is back).
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import uuid
from collections.abc import Awaitable, Callable

import redis.asyncio as aioredis
from redis.asyncio.client import Pipeline
from redis.exceptions import RedisError

from router.cluster import lua
from router.cluster.keys import Keys

log = logging.getLogger("loraplane.router.cluster")

REDIS_ERRORS = (RedisError, OSError)  # what an unreachable or failing Redis raises

OnBeat = Callable[[], Awaitable[None]]


def new_pid() -> str:
    return f"{socket.gethostname()[:40]}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


class Liveness:
    def __init__(self, redis: aioredis.Redis, keys: Keys, pid: str, *, lease_s: float) -> None:
        self.pid = pid
        self.lease_ms = int(lease_s * 1000)
        self._keys = keys
        self._down = False
        self._leading: set[str] = set()
        self._heartbeat = redis.register_script(lua.HEARTBEAT)
        self._lead = redis.register_script(lua.LEAD)
        self._resign = redis.register_script(lua.RESIGN)

    # ------------------------------------------------------------------ health of the shared store

    @property
    def down(self) -> bool:
        return self._down

    def failed(self, exc: Exception) -> None:
        if not self._down:
            self._down = True
            log.error(
                "redis unreachable: cluster state is per process until it is back "
                "(loads are singleflight within this process only)",
                extra={"error": str(exc)},
            )

    def recovered(self) -> None:
        if self._down:
            self._down = False
            log.warning("redis reachable again: cluster state shared again")

    # ------------------------------------------------------------------ process lease

    async def beat(self, then: OnBeat) -> None:
        """Renew the lease, then ``then()`` (re-assert what Redis may have lost); never raises."""
        try:
            await self._heartbeat(keys=[self._keys.procs], args=[self.pid, self.lease_ms])
            await then()
        except REDIS_ERRORS as exc:
            self.failed(exc)
            return
        self.recovered()

    async def heartbeat_loop(self, then: OnBeat) -> None:
        period = max(self.lease_ms / 3000.0, 0.05)
        while True:
            await asyncio.sleep(period if not self._down else min(period, 1.0))
            await self.beat(then)

    # ------------------------------------------------------------------ chore leaders

    async def lead(self, name: str) -> bool:
        if self._down:
            return True  # alone: do the chore here (SPEC §18: recover without a restart)
        try:
            got = bool(await self._lead(keys=[self._keys.lead(name)], args=[self.pid, self.lease_ms]))
        except REDIS_ERRORS as exc:
            self.failed(exc)
            return True
        if got:
            self._leading.add(name)
        else:
            self._leading.discard(name)
        return got

    # ------------------------------------------------------------------ goodbye

    def goodbye(self, pipe: Pipeline) -> None:
        """Queue the end of this process's lease (its marks and records stop counting at once)."""
        pipe.zrem(self._keys.procs, self.pid)

    async def resign_all(self) -> None:
        """Give up every chore lease held (raises what Redis raises)."""
        for name in list(self._leading):
            await self._resign(keys=[self._keys.lead(name)], args=[self.pid])
