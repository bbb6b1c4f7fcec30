"""Who runs the analysis: one process in the cluster at a time (SPEC §16).

``RedisLease``: a key holding this process's id with an expiry (``SET NX PX``), renewed by its
holder (compare-and-expire in Lua) on every tick; a holder that dies stops renewing and another
process takes over once the key expires. ``LocalLease``: always held (``loraplane up``: one
process). Redis errors count as "not held" — a process that cannot reach Redis never acts.
"""

from __future__ import annotations

import logging
import os
import uuid
from typing import Any, Protocol

log = logging.getLogger("loraplane.canary")

_RENEW = """
if redis.call('get', KEYS[1]) == ARGV[1] then
  return redis.call('pexpire', KEYS[1], ARGV[2])
end
return 0
"""
_RELEASE = """
if redis.call('get', KEYS[1]) == ARGV[1] then
  return redis.call('del', KEYS[1])
end
return 0
"""


class Lease(Protocol):
    holder: str

    async def hold(self) -> bool:
        """Take or renew the lease; True while this process holds it."""
        ...

    async def release(self) -> None: ...


class LocalLease:
    def __init__(self) -> None:
        self.holder = f"local-{os.getpid()}"

    async def hold(self) -> bool:
        return True

    async def release(self) -> None:
        return None


class RedisLease:
    def __init__(self, redis: Any, prefix: str, *, ttl_s: float = 10.0) -> None:
        self.redis = redis
        self.key = f"{prefix}canary:analyser-lease"
        self.ttl_ms = int(ttl_s * 1000)
        self.holder = f"{os.getpid()}-{uuid.uuid4().hex[:12]}"
        self._held = False
        self._failing = False

    async def hold(self) -> bool:
        try:
            if self._held and await self.redis.eval(_RENEW, 1, self.key, self.holder, self.ttl_ms):
                held = True
            else:
                held = bool(await self.redis.set(self.key, self.holder, nx=True, px=self.ttl_ms))
            if self._failing:
                log.info("canary analyser lease: Redis reachable again")
            self._failing = False
        except Exception as e:  # redis.RedisError, OSError: nobody acts without the lease
            if not self._failing:
                log.warning("canary analyser lease: Redis unreachable (%s): not analysing", type(e).__name__)
            self._failing = True
            held = False
        if held != self._held:
            log.info("canary analyser lease %s by %s", "taken" if held else "lost", self.holder)
        self._held = held
        return held

    async def release(self) -> None:
        if not self._held:
            return
        self._held = False
        try:
            await self.redis.eval(_RELEASE, 1, self.key, self.holder)
        except Exception:  # best effort: the key expires anyway
            log.debug("canary analyser lease release failed", exc_info=True)
