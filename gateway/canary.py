"""Outcome counters for canary analysis, fed by every gateway request (SPEC §16).

Only requests for an adapter that has a canary when they are resolved are counted, for the
version that served them (the canary and the active arm alike). An answer counts as an *error*
when it is a 5xx (replica errors, wrong-adapter answers — the router turns those into 502 — and
timeouts, streams that ended in an error event included); 4xx answers (the client's fault, rate
limits) and client disconnects (499) are not counted at all. TTFT is the first streamed chunk
for streams and the whole answer otherwise (the first byte the client gets).

- :class:`MemoryCanaryCounters` (embedded default, ``loraplane up``): counts in this process; the
  in-process analyser reads them directly.
- :class:`RedisCanaryRecorder` (cluster): counts in a local batch, added to the shared Redis
  hashes of :mod:`registry.canary.counters` every ``flush_interval_s`` in one pipeline — never a
  round trip per request. A failed flush keeps the batch for the next one (it is bounded: one
  entry per version); what a process held when it died is lost, which only delays a decision.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any, Protocol

from registry.canary.counters import KEY_TTL_S, ArmCounts, counter_key
from registry.canary.sketch import bucket_of

log = logging.getLogger("loraplane.gateway.canary")


def outcome(status: int) -> bool | None:
    """True for an error, False for a success, None when the answer is not counted."""
    if status >= 500:
        return True
    if status >= 400 or status == 0:
        return None
    return False


class CanaryRecorder(Protocol):
    def record(self, adapter_id: str, version: str, status: int, ttft_s: float | None) -> None:
        """Count one answer (never blocks, never raises)."""
        ...

    async def close(self) -> None: ...


def _add(
    into: dict[tuple[str, str], ArmCounts], key: tuple[str, str], status: int, ttft_s: float | None
) -> None:
    err = outcome(status)
    if err is None:
        return
    counts = into.get(key)
    if counts is None:
        counts = into[key] = ArmCounts()
    counts.requests += 1
    if err:
        counts.errors += 1
    elif ttft_s is not None:
        counts.ttft[bucket_of(ttft_s)] += 1


class MemoryCanaryCounters:
    """Recorder and counter source in one process."""

    def __init__(self) -> None:
        self._counts: dict[tuple[str, str], ArmCounts] = {}

    def record(self, adapter_id: str, version: str, status: int, ttft_s: float | None) -> None:
        _add(self._counts, (adapter_id, version), status, ttft_s)

    async def read(self, adapter_id: str, version: str) -> ArmCounts:
        counts = self._counts.get((adapter_id, version))
        return counts.copy() if counts is not None else ArmCounts()

    async def close(self) -> None:
        return None


class RedisCanaryRecorder:
    """Batches counts and adds them to the cluster's Redis hashes."""

    def __init__(self, redis: Any, prefix: str, *, flush_interval_s: float = 0.5) -> None:
        self.redis = redis
        self.prefix = prefix
        self.flush_interval_s = flush_interval_s
        self._batch: dict[tuple[str, str], ArmCounts] = {}
        self._task: asyncio.Task[None] | None = None
        self._failing = False

    def record(self, adapter_id: str, version: str, status: int, ttft_s: float | None) -> None:
        _add(self._batch, (adapter_id, version), status, ttft_s)
        if self._task is None:
            with contextlib.suppress(RuntimeError):  # no running loop: the next record starts it
                self._task = asyncio.get_running_loop().create_task(self._loop(), name="canary-flush")

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self.flush_interval_s)
            await self.flush()

    async def flush(self) -> None:
        batch, self._batch = self._batch, {}
        if not batch:
            return
        try:
            pipe = self.redis.pipeline(transaction=True)  # MULTI/EXEC: all of a batch or none
            for (adapter_id, version), counts in batch.items():
                key = counter_key(self.prefix, adapter_id, version)
                for name, value in counts.to_fields().items():
                    pipe.hincrby(key, name, value)
                pipe.expire(key, KEY_TTL_S)
            await pipe.execute()
            if self._failing:
                log.info("canary counters: Redis reachable again")
            self._failing = False
        except Exception as e:  # redis.RedisError, OSError: keep the counts for the next flush
            if not self._failing:
                log.warning("canary counters: flush to Redis failed (%s); retrying", type(e).__name__)
            self._failing = True
            for arm, counts in batch.items():
                held = self._batch.get(arm)
                if held is None:
                    self._batch[arm] = counts
                else:
                    held.add(counts)

    async def close(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self.flush()
