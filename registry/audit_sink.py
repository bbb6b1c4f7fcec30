"""CONTRACT: how code outside the registry's request transactions (the router) records audit
events (``adapter.loaded``, ``adapter.unloaded``, ``adapter.load_failed``,
``adapter.hash_mismatch``). The registry implements it in ``registry.services.audit`` as
``DbAuditSink(session_factory)`` (each call: one short transaction, run off the event loop).
"""

from __future__ import annotations

import asyncio
import collections
import logging
from typing import Any, Protocol

log = logging.getLogger("loraplane.audit")


class AuditSink(Protocol):
    async def record(
        self, *, actor: str, action: str, subject_type: str, subject_id: str, details: dict[str, Any]
    ) -> None: ...


class BufferedAuditSink:
    """Wraps a sink so that recording never waits on the database (SPEC §18).

    ``record`` queues the event (at most ``capacity``; beyond that the oldest is dropped,
    counted in ``dropped`` and logged once per outage) and returns at once; one writer task
    drains the queue in order, and while the inner sink fails (database down or hung) it keeps
    the events and retries every ``retry_s``, so they are written when the database is back.
    ``close`` writes what it can within ``close_timeout_s``. ``dropped`` and ``pending`` are the
    router's ``loraplane_audit_events_dropped_total`` and ``loraplane_audit_events_buffered``
    (``router.audit``).
    """

    def __init__(
        self, inner: AuditSink, *, capacity: int = 10_000, retry_s: float = 1.0, close_timeout_s: float = 5.0
    ) -> None:
        self._inner = inner
        self._queue: collections.deque[dict[str, Any]] = collections.deque()
        self._capacity = capacity
        self._retry_s = retry_s
        self._close_timeout_s = close_timeout_s
        self._task: asyncio.Task[None] | None = None
        self.dropped = 0  # events dropped because the buffer was full, since start
        self.failing = False
        self._dropping = False

    @property
    def pending(self) -> int:
        return len(self._queue)

    async def record(
        self, *, actor: str, action: str, subject_type: str, subject_id: str, details: dict[str, Any]
    ) -> None:
        if len(self._queue) >= self._capacity:
            self._queue.popleft()
            self.dropped += 1
            if not self._dropping:  # once until events are written again
                self._dropping = True
                log.error(
                    "audit buffer full; dropping the oldest events",
                    extra={"capacity": self._capacity, "dropped": self.dropped},
                )
        self._queue.append(
            {
                "actor": actor,
                "action": action,
                "subject_type": subject_type,
                "subject_id": subject_id,
                "details": details,
            }
        )
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._drain(), name="audit-writer")

    async def _drain(self) -> None:
        while self._queue:
            event = self._queue[0]
            try:
                await self._inner.record(**event)
            except Exception as exc:
                if not self.failing:
                    self.failing = True
                    log.error(
                        "audit events cannot be written; keeping them until the database is back",
                        extra={"error": str(exc), "pending": len(self._queue)},
                    )
                await asyncio.sleep(self._retry_s)
                continue
            if self.failing:
                self.failing = False
                self._dropping = False
                log.warning(
                    "audit events written again",
                    extra={"pending": len(self._queue) - 1, "dropped": self.dropped},
                )
            if self._queue and self._queue[0] is event:
                self._queue.popleft()

    async def close(self) -> None:
        task = self._task
        if task is None:
            return
        try:
            await asyncio.wait_for(asyncio.shield(task), self._close_timeout_s)
        except TimeoutError:
            task.cancel()
            log.warning("audit events not written at shutdown", extra={"pending": len(self._queue)})


class MemoryAuditSink:
    """For tests: keeps events in a list."""

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []

    async def record(
        self, *, actor: str, action: str, subject_type: str, subject_id: str, details: dict[str, Any]
    ) -> None:
        self.events.append(
            {
                "actor": actor,
                "action": action,
                "subject_type": subject_type,
                "subject_id": subject_id,
                "details": details,
            }
        )
