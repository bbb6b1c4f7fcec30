"""In-memory limiter (embedded default, one gateway process). Same semantics as the Redis one.

Everything in :meth:`admit` runs without awaiting, so it is atomic on the event loop.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from gateway.ratelimit.base import AdmissionPlan, AdmitResult, Bucket, BucketState, Lease, lease_for


def _rate(limit: int) -> float:
    return limit / 60.0


class MemoryLimiter:
    name = "memory"

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._buckets: dict[str, tuple[float, float]] = {}  # key → (tokens, at)
        self._slots: dict[str, set[str]] = {}

    def _level(self, b: Bucket, now: float) -> float:
        cur = self._buckets.get(b.key)
        if cur is None:
            return float(b.limit)
        tokens, at = cur
        return min(float(b.limit), tokens + max(0.0, now - at) * _rate(b.limit))

    def _states(self, plan: AdmissionPlan, levels: list[float], taken: bool) -> list[BucketState]:
        out = []
        for b, lvl in zip(plan.buckets, levels, strict=True):
            left = lvl - b.cost if taken else lvl
            reset = (b.limit - left) / _rate(b.limit) if b.limit > 0 else 0.0  # a 0 limit: always "full"
            out.append(BucketState(b, int(left // 1), max(0.0, reset)))
        return out

    async def admit(self, plan: AdmissionPlan) -> AdmitResult:
        now = self._clock()
        levels = [self._level(b, now) for b in plan.buckets]
        for b, lvl in zip(plan.buckets, levels, strict=True):
            if lvl < b.cost:
                wait = 60.0 if b.cost > b.limit else (b.cost - lvl) / _rate(b.limit)
                return AdmitResult(False, self._states(plan, levels, False), b.kind, b.scope, b.limit, wait)
        for slot in plan.slots:
            if len(self._slots.get(slot.key, ())) >= slot.limit:
                # one process: every slot belongs to a live request of this process (a limit of 0
                # never admits: 60 s, like a tpm cost over capacity)
                wait = 1.0 if slot.limit > 0 else 60.0
                return AdmitResult(
                    False, self._states(plan, levels, False), "concurrency", slot.scope, slot.limit, wait
                )
        lease = lease_for(plan)
        for b, lvl in zip(plan.buckets, levels, strict=True):
            self._buckets[b.key] = (lvl - b.cost, now)
        for slot in plan.slots:
            self._slots.setdefault(slot.key, set()).add(lease.lease_id)
        return AdmitResult(True, self._states(plan, levels, True), lease=lease)

    async def peek(self, plan: AdmissionPlan) -> list[BucketState]:
        now = self._clock()
        return self._states(plan, [self._level(b, now) for b in plan.buckets], False)

    async def settle(self, lease: Lease, actual_tokens: int | None) -> None:
        if lease.settled:
            return
        lease.settled = True
        if actual_tokens is not None and actual_tokens != lease.estimated_tokens:
            now = self._clock()
            delta = actual_tokens - lease.estimated_tokens
            for b in lease.token_buckets:
                lvl = self._level(b, now)
                self._buckets[b.key] = (max(-float(b.limit), min(float(b.limit), lvl - delta)), now)
        for key in lease.slot_keys:
            held = self._slots.get(key)
            if held is not None:
                held.discard(lease.lease_id)
                if not held:
                    del self._slots[key]

    def in_use(self, concurrency_key: str) -> int:
        """Open concurrency slots (for tests and /readyz)."""
        return len(self._slots.get(concurrency_key, ()))

    async def healthy(self) -> bool:
        return True

    async def close(self) -> None:
        return None
