"""Redis limiter: atomic across gateway processes — ONE Lua script (EVALSHA) per admission.

The script reads Redis's own clock (``TIME``, so gateway clocks never disagree), computes
every bucket's level, checks every limit of every level, and only when all pass writes all of
them (token buckets as hashes ``{t: tokens, ts: seconds}`` with a short expiry; each concurrency
limit as a sorted set of lease ids scored by their expiry). A second script settles: corrects
the tpm buckets and removes the lease from its sets. Redis errors become
:class:`LimiterUnavailable`.

Slots with liveness: a lease id is ``<process id>:<n>``, and each process renews the expiry of
every lease it holds to ``now + lease_s`` every ``lease_s / 3`` — one script call per period for
all of them (a background task, nothing per request). A live request keeps its slot however long
it runs; the slots of a process that died (SIGKILL, lost host) expire within ``lease_s`` and the
next admission drops them. A concurrency rejection's ``Retry-After`` is true: 1 s when a live
request holds a slot (it frees when that request ends), otherwise the time until the first
slot of a process that stopped renewing (one not renewed for ``2 * lease_s / 3``, a whole
renewal period late) expires; 60 s for a limit of 0 (never admits, like a tpm cost over capacity).

The scripts go through an :class:`~gateway.ratelimit.autopipe.AutoPipeline`: the admissions and
settlements of one event-loop step share one write on one pipelined connection (each still its
own atomic ``EVALSHA``, with its own reply or error), and no caller waits longer than
``timeout_s``.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from gateway.ratelimit.autopipe import AutoPipeline, RoundTripError
from gateway.ratelimit.base import (
    AdmissionPlan,
    AdmitResult,
    BucketState,
    Lease,
    LimiterUnavailable,
    lease_for,
)
from kit.ids import new_id

log = logging.getLogger("loraplane.gateway.ratelimit")


# ARGV: n buckets, m slots, lease id, lease_s, dry, stale_s, then n x (capacity, cost), then
# m x limit. KEYS: the n bucket keys, then the m slot keys. Returns {admitted, rejected index
# (1..n a bucket, n+1..n+m a slot), seconds to wait, slots held, bucket levels...}.
ADMIT_LUA = """
local n = tonumber(ARGV[1])
local m = tonumber(ARGV[2])
local lease_s = tonumber(ARGV[4])
local dry = tonumber(ARGV[5])
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local levels = {}
local reject = 0
local wait = 0
local held = 0
for i = 1, n do
  local cap = tonumber(ARGV[5 + 2 * i])
  local cost = tonumber(ARGV[6 + 2 * i])
  local rate = cap / 60.0
  local v = redis.call('HMGET', KEYS[i], 't', 'ts')
  local lvl = cap
  if v[1] then
    lvl = math.min(cap, tonumber(v[1]) + math.max(0, now - tonumber(v[2])) * rate)
  end
  levels[i] = lvl
  if reject == 0 and lvl < cost then
    reject = i
    if cost > cap then wait = 60 else wait = (cost - lvl) / rate end
  end
end
if reject == 0 then
  for j = 1, m do
    local ck = KEYS[n + j]
    redis.call('ZREMRANGEBYSCORE', ck, '-inf', now)
    local c = redis.call('ZCARD', ck)
    if c >= tonumber(ARGV[6 + 2 * n + j]) then
      reject = n + j
      held = c
      if c == 0 then
        wait = 60
      elseif redis.call('ZCOUNT', ck, now + tonumber(ARGV[6]), '+inf') > 0 then
        wait = 1
      else
        local first = redis.call('ZRANGE', ck, 0, 0, 'WITHSCORES')
        wait = math.max(0, tonumber(first[2]) - now)
      end
      break
    end
  end
end
local out = {}
if reject == 0 and dry == 0 then
  for i = 1, n do
    local cost = tonumber(ARGV[6 + 2 * i])
    levels[i] = levels[i] - cost
    redis.call('HSET', KEYS[i], 't', tostring(levels[i]), 'ts', tostring(now))
    redis.call('EXPIRE', KEYS[i], 120)
  end
  for j = 1, m do
    local ck = KEYS[n + j]
    redis.call('ZADD', ck, now + lease_s, ARGV[3])
    redis.call('EXPIRE', ck, math.ceil(lease_s) + 60)
  end
  out[1] = 1
else
  out[1] = 0
end
out[2] = reject
out[3] = tostring(wait)
out[4] = held
for i = 1, n do out[4 + i] = tostring(levels[i]) end
return out
"""

# ARGV: n buckets, m slots, lease id, then n x (capacity, tokens to charge). KEYS: n, then m.
SETTLE_LUA = """
local n = tonumber(ARGV[1])
local m = tonumber(ARGV[2])
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
for i = 1, n do
  local cap = tonumber(ARGV[2 + 2 * i])
  local delta = tonumber(ARGV[3 + 2 * i])
  if delta ~= 0 then
    local rate = cap / 60.0
    local v = redis.call('HMGET', KEYS[i], 't', 'ts')
    local lvl = cap
    if v[1] then
      lvl = math.min(cap, tonumber(v[1]) + math.max(0, now - tonumber(v[2])) * rate)
    end
    lvl = math.max(-cap, math.min(cap, lvl - delta))
    redis.call('HSET', KEYS[i], 't', tostring(lvl), 'ts', tostring(now))
    redis.call('EXPIRE', KEYS[i], 120)
  end
end
for j = 1, m do
  redis.call('ZREM', KEYS[n + j], ARGV[3])
end
return {1}
"""

# Renewal of one process's slots. ARGV: lease_s, then per key: count c, then c lease ids.
# XX: a lease already settled (or expired and dropped) is never brought back.
RENEW_LUA = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local lease_s = tonumber(ARGV[1])
local a = 2
local renewed = 0
for k = 1, #KEYS do
  local c = tonumber(ARGV[a])
  for i = 1, c do
    renewed = renewed + redis.call('ZADD', KEYS[k], 'XX', 'CH', now + lease_s, ARGV[a + i])
  end
  a = a + c + 1
  if redis.call('EXISTS', KEYS[k]) == 1 then
    redis.call('EXPIRE', KEYS[k], math.ceil(lease_s) + 60)
  end
end
return {renewed}
"""


def _discard(reply: asyncio.Future[object]) -> None:
    if not reply.cancelled():
        reply.exception()  # retrieved: no "never retrieved" warning for a reply nobody awaits


def _unavailable(e: BaseException) -> LimiterUnavailable:
    what = str(e) if isinstance(e, RoundTripError) else f"{type(e).__name__}: {e}"
    return LimiterUnavailable(f"rate-limit store unreachable: {what}")


RENEW_BATCH = 1000  # lease ids per renewal script call


class RedisLimiter:
    name = "redis"

    def __init__(
        self,
        redis: aioredis.Redis,
        *,
        prefix: str = "loraplane:",
        lease_s: float = 30.0,
        timeout_s: float = 2.0,
        process_id: str | None = None,
    ) -> None:
        if lease_s <= 0:
            raise ValueError("lease_s must be positive")
        self._r = redis
        self._prefix = prefix + "rl:"
        self._lease_s = lease_s
        self._timeout = timeout_s
        self.process_id = process_id or new_id()
        self._ids = itertools.count(1)
        self._pipe = AutoPipeline(redis, timeout_s=timeout_s)
        self._admit = self._pipe.register_script(ADMIT_LUA)
        self._settle = self._pipe.register_script(SETTLE_LUA)
        self._renew = self._pipe.register_script(RENEW_LUA)
        self._held: dict[str, tuple[str, ...]] = {}  # lease id → its slot keys (with prefix)
        self._renewer: asyncio.Task[None] | None = None
        self._renew_failing = False

    @property
    def lease_s(self) -> float:
        return self._lease_s

    async def _run(self, sha: str, keys: list[str], args: list[str | int | float]) -> list[object]:
        try:
            return list(await self._pipe.execute("EVALSHA", sha, len(keys), *keys, *args))
        except (RedisError, OSError, TimeoutError) as e:
            raise _unavailable(e) from e

    async def _call(self, plan: AdmissionPlan, lease_id: str, dry: bool) -> list[object]:
        p = self._prefix
        keys = [p + b.key for b in plan.buckets]
        keys += [p + s.key for s in plan.slots]
        args: list[str | int | float] = [
            len(plan.buckets), len(plan.slots), lease_id, self._lease_s, 1 if dry else 0, self._lease_s / 3,
        ]  # fmt: skip
        for b in plan.buckets:
            args += [b.limit, b.cost]
        for s in plan.slots:
            args.append(s.limit)
        return await self._run(self._admit, keys, args)

    @staticmethod
    def _states(plan: AdmissionPlan, raw: list[object]) -> list[BucketState]:
        out = []
        for i, b in enumerate(plan.buckets):
            lvl = float(_s(raw[4 + i]))
            reset = (b.limit - lvl) * 60.0 / b.limit if b.limit > 0 else 0.0  # a 0 limit: always "full"
            out.append(BucketState(b, int(lvl // 1), max(0.0, reset)))
        return out

    async def admit(self, plan: AdmissionPlan) -> AdmitResult:
        lease = lease_for(plan, f"{self.process_id}:{next(self._ids)}")
        raw = await self._call(plan, lease.lease_id, dry=False)
        states = self._states(plan, raw)
        if int(_s(raw[0])) == 1:
            if lease.slot_keys:
                self._held[lease.lease_id] = tuple(self._prefix + k for k in lease.slot_keys)
                if self._renewer is None or self._renewer.done():
                    self._renewer = asyncio.create_task(self._renew_loop(), name="slot-lease-renewal")
            return AdmitResult(True, states, lease=lease)
        idx = int(_s(raw[1]))
        wait = float(_s(raw[2]))
        n = len(plan.buckets)
        if idx <= n:
            b = plan.buckets[idx - 1]
            return AdmitResult(False, states, b.kind, b.scope, b.limit, wait)
        slot = plan.slots[idx - n - 1]
        return AdmitResult(False, states, "concurrency", slot.scope, slot.limit, wait)

    async def peek(self, plan: AdmissionPlan) -> list[BucketState]:
        if not plan.buckets:
            return []
        bare = AdmissionPlan(buckets=plan.buckets)
        return self._states(bare, await self._call(bare, "peek", dry=True))

    async def settle(self, lease: Lease, actual_tokens: int | None) -> None:
        if lease.settled:
            return
        lease.settled = True
        self._held.pop(lease.lease_id, None)
        delta = 0 if actual_tokens is None else actual_tokens - lease.estimated_tokens
        buckets = lease.token_buckets if delta else ()
        if not buckets and not lease.slot_keys:
            return
        keys = [self._prefix + b.key for b in buckets]
        keys += [self._prefix + k for k in lease.slot_keys]
        args: list[str | int | float] = [len(buckets), len(lease.slot_keys), lease.lease_id]
        for b in buckets:
            args += [b.limit, delta]
        reply = self._pipe.execute("EVALSHA", self._settle, len(keys), *keys, *args)
        try:
            # shielded: cancelled (the client went away), the settlement still goes out — the
            # lease is no longer renewed, so left out its slot would stay taken until it expired
            await asyncio.shield(reply)
        except asyncio.CancelledError:
            reply.add_done_callback(_discard)  # nobody waits for its reply
            raise
        except (RedisError, OSError, TimeoutError) as e:
            raise _unavailable(e) from e

    # ------------------------------------------------------------------ slot liveness

    async def renew(self) -> int:
        """Push the expiry of every slot this process holds to ``now + lease_s``; the number of
        (slot, lease) entries renewed. One script call per :data:`RENEW_BATCH` leases."""
        renewed = 0
        items = list(self._held.items())
        for start in range(0, len(items), RENEW_BATCH):
            by_key: dict[str, list[str]] = {}
            for lease_id, keys in items[start : start + RENEW_BATCH]:
                for k in keys:
                    by_key.setdefault(k, []).append(lease_id)
            args: list[str | int | float] = [self._lease_s]
            for ids in by_key.values():
                args.append(len(ids))
                args += ids
            renewed += int(_s((await self._run(self._renew, list(by_key), args))[0]))
        return renewed

    async def _renew_loop(self) -> None:
        period = self._lease_s / 3
        while self._held:
            await asyncio.sleep(period)
            try:
                await self.renew()
            except Exception as e:  # never let the loop die: slots would then expire under live requests
                if not self._renew_failing:
                    log.error("renewing concurrency slots failed", extra={"error": str(e)})
                self._renew_failing = True
            else:
                if self._renew_failing:
                    log.warning("renewing concurrency slots works again")
                self._renew_failing = False

    def held(self) -> int:
        """Leases with concurrency slots this process holds (and renews)."""
        return len(self._held)

    async def in_use(self, concurrency_key: str) -> int:
        """Open concurrency slots under ``concurrency_key`` (tests)."""
        return int(await self._r.zcard(self._prefix + concurrency_key))

    async def healthy(self) -> bool:
        try:
            async with asyncio.timeout(self._timeout):
                return bool(await self._r.ping())
        except (RedisError, OSError, TimeoutError):
            return False

    async def close(self) -> None:
        if self._renewer is not None:
            self._renewer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._renewer
            self._renewer = None
        await self._pipe.aclose()
        await self._r.aclose()


def _s(v: object) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)
