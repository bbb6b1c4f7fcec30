"""Outcome counters for canary analysis, fed by every gateway request (SPEC §16).

Only requests for an adapter that has a canary when they are resolved are counted, for the
version that served them (the canary and the active arm alike). An answer counts as an *error*
when it is a 5xx (replica errors, wrong-adapter answers — the router turns those into 502 — and
timeouts, streams the router ended with an error event included, and streams in which the
engine sent its own in-band error event, logged 502 ``engine_error``); 4xx answers (the
client's fault, rate limits) and client disconnects (499) are not counted at all. An answer
that another version served (the adapter's load-failure fallback, SPEC §15) is an error of the
version asked for.
TTFT is the first streamed chunk for streams and the whole answer otherwise (the first byte the
client gets); answers that waited for a cold load give no TTFT sample (a canary's first answers
would otherwise carry its load time, and a p99 over few answers is their maximum).

Sampled answers: the text of up to :data:`SAMPLES_PER_FLUSH` successful non-streamed answers per
version and flush interval is kept (16 KiB each at most) for the analyser, which runs the
adapter's regression-set format checks on them (``registry.canary.checks``); only sampled answers
are parsed.

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
from collections import deque
from typing import Any, Protocol

import orjson

from kit.aio import cancel_all
from registry.canary.counters import ANSWERS_KEPT, KEY_TTL_S, ArmCounts, answers_key, counter_key
from registry.canary.sketch import bucket_of

log = logging.getLogger("loraplane.gateway.canary")

SAMPLES_PER_FLUSH = 20  # answers kept per version and flush interval (bounds the parsing cost)
_MAX_ANSWER_CHARS = 16384


def answer_text(body: bytes) -> str | None:
    """The first choice's text of an OpenAI chat or text completion body (None if none)."""
    try:
        data = orjson.loads(body)
        choice = data["choices"][0]
        text = choice["message"]["content"] if "message" in choice else choice["text"]
    except (orjson.JSONDecodeError, KeyError, IndexError, TypeError):
        return None
    return text[:_MAX_ANSWER_CHARS] if isinstance(text, str) else None


def outcome(status: int) -> bool | None:
    """True for an error, False for a success, None when the answer is not counted."""
    if status >= 500:
        return True
    if status >= 400 or status == 0:
        return None
    return False


class CanaryRecorder(Protocol):
    def record(
        self, adapter_id: str, version: str, status: int, ttft_s: float | None,
        *, other_version: bool = False, answer: bytes | None = None,
    ) -> None:  # fmt: skip
        """Count one answer (never blocks, never raises); ``other_version``: a fallback served it;
        ``answer``: the non-streamed body of a successful answer (sampled for format checks)."""
        ...

    async def close(self) -> None: ...


def _add(
    into: dict[tuple[str, str], ArmCounts], key: tuple[str, str], status: int, ttft_s: float | None,
    other_version: bool = False,
) -> None:  # fmt: skip
    err = outcome(status)
    if err is None:
        return
    err = err or other_version
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
        self._answers: dict[tuple[str, str], deque[str]] = {}

    def record(
        self, adapter_id: str, version: str, status: int, ttft_s: float | None,
        *, other_version: bool = False, answer: bytes | None = None,
    ) -> None:  # fmt: skip
        key = (adapter_id, version)
        _add(self._counts, key, status, ttft_s, other_version)
        if answer is not None and not other_version and status < 400:
            text = answer_text(answer)
            if text is not None:
                self._answers.setdefault(key, deque(maxlen=ANSWERS_KEPT)).append(text)

    async def read(self, adapter_id: str, version: str) -> ArmCounts:
        counts = self._counts.get((adapter_id, version))
        return counts.copy() if counts is not None else ArmCounts()

    async def take_answers(self, adapter_id: str, version: str, limit: int) -> list[str]:
        kept = self._answers.get((adapter_id, version))
        out: list[str] = []
        while kept and len(out) < limit:
            out.append(kept.popleft())
        return out

    async def close(self) -> None:
        return None


class RedisCanaryRecorder:
    """Batches counts and adds them to the cluster's Redis hashes."""

    def __init__(
        self, redis: Any, prefix: str, *, flush_interval_s: float = 0.5, owns_redis: bool = False
    ) -> None:
        self.redis = redis
        self.owns_redis = owns_redis  # close the client with the recorder
        self.prefix = prefix
        self.flush_interval_s = flush_interval_s
        self._batch: dict[tuple[str, str], ArmCounts] = {}
        self._answers: dict[tuple[str, str], list[str]] = {}
        self._task: asyncio.Task[None] | None = None
        self._failing = False

    def record(
        self, adapter_id: str, version: str, status: int, ttft_s: float | None,
        *, other_version: bool = False, answer: bytes | None = None,
    ) -> None:  # fmt: skip
        key = (adapter_id, version)
        _add(self._batch, key, status, ttft_s, other_version)
        if answer is not None and not other_version and status < 400:
            kept = self._answers.setdefault(key, [])
            if len(kept) < SAMPLES_PER_FLUSH:
                text = answer_text(answer)
                if text is not None:
                    kept.append(text)
        if self._task is None:
            with contextlib.suppress(RuntimeError):  # no running loop: the next record starts it
                self._task = asyncio.get_running_loop().create_task(self._loop(), name="canary-flush")

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self.flush_interval_s)
            await self.flush()

    async def flush(self) -> None:
        batch, self._batch = self._batch, {}
        answers, self._answers = self._answers, {}
        if not batch:
            return
        try:
            pipe = self.redis.pipeline(transaction=True)  # MULTI/EXEC: all of a batch or none
            for (adapter_id, version), counts in batch.items():
                key = counter_key(self.prefix, adapter_id, version)
                for name, value in counts.to_fields().items():
                    pipe.hincrby(key, name, value)
                pipe.expire(key, KEY_TTL_S)
            for (adapter_id, version), texts in answers.items():
                if texts:
                    key = answers_key(self.prefix, adapter_id, version)
                    pipe.rpush(key, *texts)
                    pipe.ltrim(key, -ANSWERS_KEPT, -1)
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
            await cancel_all([task])
        await self.flush()
        if self.owns_redis:
            await self.redis.aclose()
