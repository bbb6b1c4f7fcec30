"""Redis limiter: atomic across gateway processes — ONE Lua script (EVALSHA) per admission.

The script reads Redis's own clock (``TIME``, so gateway clocks never disagree), computes
every bucket's level, checks every limit, and only when all pass writes all of them (token
buckets as hashes ``{t: tokens, ts: seconds}`` with a short expiry; concurrency as a sorted
set of lease ids scored by their safety expiry). A second script settles: corrects the tpm
buckets and removes the lease. Redis errors become :class:`LimiterUnavailable`.

The scripts go through an :class:`~gateway.ratelimit.autopipe.AutoPipeline`: concurrent
admissions and settlements share one round trip on one connection (each still its own atomic
``EVALSHA``, with its own reply or error), and no caller waits longer than ``timeout_s``.
"""

from __future__ import annotations

import asyncio

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

ADMIT_LUA = """
local n = tonumber(ARGV[1])
local has_conc = tonumber(ARGV[2])
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local levels = {}
local reject = 0
local wait = 0
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
local held = 0
if has_conc == 1 then
  local ck = KEYS[n + 1]
  redis.call('ZREMRANGEBYSCORE', ck, '-inf', now)
  held = redis.call('ZCARD', ck)
  if reject == 0 and held >= tonumber(ARGV[3]) then
    reject = n + 1
    wait = 1
  end
end
local dry = tonumber(ARGV[6])
local out = {}
if reject == 0 and dry == 0 then
  for i = 1, n do
    local cost = tonumber(ARGV[6 + 2 * i])
    levels[i] = levels[i] - cost
    redis.call('HSET', KEYS[i], 't', tostring(levels[i]), 'ts', tostring(now))
    redis.call('EXPIRE', KEYS[i], 120)
  end
  if has_conc == 1 then
    local ck = KEYS[n + 1]
    redis.call('ZADD', ck, now + tonumber(ARGV[5]), ARGV[4])
    redis.call('EXPIRE', ck, math.ceil(tonumber(ARGV[5])) + 60)
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

SETTLE_LUA = """
local n = tonumber(ARGV[1])
local has_conc = tonumber(ARGV[2])
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
if has_conc == 1 then
  redis.call('ZREM', KEYS[n + 1], ARGV[3])
end
return {1}
"""


class RedisLimiter:
    name = "redis"

    def __init__(
        self,
        redis: aioredis.Redis,
        *,
        prefix: str = "loraplane:",
        lease_s: float = 900.0,
        timeout_s: float = 2.0,
    ) -> None:
        self._r = redis
        self._prefix = prefix + "rl:"
        self._lease_s = lease_s
        self._timeout = timeout_s
        self._pipe = AutoPipeline(redis, timeout_s=timeout_s)
        self._admit = self._pipe.register_script(ADMIT_LUA)
        self._settle = self._pipe.register_script(SETTLE_LUA)

    async def _run(self, sha: str, keys: list[str], args: list[str | int | float]) -> list[object]:
        try:
            return list(await self._pipe.execute("EVALSHA", sha, len(keys), *keys, *args))
        except (RedisError, OSError, TimeoutError) as e:
            what = str(e) if isinstance(e, RoundTripError) else f"{type(e).__name__}: {e}"
            raise LimiterUnavailable(f"rate-limit store unreachable: {what}") from e

    async def _call(self, plan: AdmissionPlan, lease_id: str, dry: bool) -> list[object]:
        keys = [self._prefix + b.key for b in plan.buckets]
        has_conc = plan.concurrency_key is not None and plan.concurrency_limit is not None
        if has_conc:
            keys.append(self._prefix + str(plan.concurrency_key))
        args: list[str | int | float] = [
            len(plan.buckets), 1 if has_conc else 0, plan.concurrency_limit or 0,
            lease_id, self._lease_s, 1 if dry else 0,
        ]  # fmt: skip
        for b in plan.buckets:
            args += [b.limit, b.cost]
        return await self._run(self._admit, keys, args)

    @staticmethod
    def _states(plan: AdmissionPlan, raw: list[object]) -> list[BucketState]:
        out = []
        for i, b in enumerate(plan.buckets):
            lvl = float(_s(raw[4 + i]))
            out.append(BucketState(b, int(lvl // 1), max(0.0, (b.limit - lvl) * 60.0 / b.limit)))
        return out

    async def admit(self, plan: AdmissionPlan) -> AdmitResult:
        lease = lease_for(plan)
        raw = await self._call(plan, lease.lease_id, dry=False)
        states = self._states(plan, raw)
        if int(_s(raw[0])) == 1:
            if plan.concurrency_key is None or plan.concurrency_limit is None:
                lease.concurrency_key = None
            return AdmitResult(True, states, lease=lease)
        idx = int(_s(raw[1]))
        wait = float(_s(raw[2]))
        if idx <= len(plan.buckets):
            b = plan.buckets[idx - 1]
            return AdmitResult(False, states, b.kind, b.scope, b.limit, wait)
        return AdmitResult(False, states, "concurrency", "tenant", plan.concurrency_limit, wait)

    async def peek(self, plan: AdmissionPlan) -> list[BucketState]:
        if not plan.buckets:
            return []
        bare = AdmissionPlan(buckets=plan.buckets)
        return self._states(bare, await self._call(bare, "peek", dry=True))

    async def settle(self, lease: Lease, actual_tokens: int | None) -> None:
        if lease.settled:
            return
        lease.settled = True
        delta = 0 if actual_tokens is None else actual_tokens - lease.estimated_tokens
        buckets = lease.token_buckets if delta else ()
        if not buckets and lease.concurrency_key is None:
            return
        keys = [self._prefix + b.key for b in buckets]
        if lease.concurrency_key is not None:
            keys.append(self._prefix + lease.concurrency_key)
        args: list[str | int | float] = [len(buckets), 1 if lease.concurrency_key else 0, lease.lease_id]
        for b in buckets:
            args += [b.limit, delta]
        await self._run(self._settle, keys, args)

    async def in_use(self, concurrency_key: str) -> int:
        """Open concurrency slots (tests)."""
        return int(await self._r.zcard(self._prefix + concurrency_key))

    async def healthy(self) -> bool:
        try:
            async with asyncio.timeout(self._timeout):
                return bool(await self._r.ping())
        except (RedisError, OSError, TimeoutError):
            return False

    async def close(self) -> None:
        await self._pipe.aclose()
        await self._r.aclose()


def _s(v: object) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)
