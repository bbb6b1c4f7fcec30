"""The router's audit events (actor ``router``, ``subject_type`` ``adapter``).

Writing one never breaks routing: a failing sink is logged and the request goes on (the
production sink buffers, see ``registry.audit_sink.BufferedAuditSink``). A buffering sink's
state is exported at scrape time (``AuditBufferMetrics``, one per ``CollectorRegistry``, summing
every buffer of the process): ``loraplane_audit_events_dropped_total`` (events dropped because
the buffer was full: never written) and ``loraplane_audit_events_buffered`` (waiting to be
written; grows while PostgreSQL is unreachable).
"""

from __future__ import annotations

import logging
import threading
import weakref
from collections.abc import Iterator
from typing import Any

from prometheus_client import REGISTRY, CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from registry.audit_sink import AuditSink, BufferedAuditSink

log = logging.getLogger("loraplane.router.audit")

ACTOR = "router"


class AuditBufferMetrics(Collector):
    """Dropped and buffered audit events of the buffers it tracks (held weakly), read at scrape time."""

    def __init__(self) -> None:
        self._buffers: weakref.WeakSet[BufferedAuditSink] = weakref.WeakSet()

    def track(self, buffer: BufferedAuditSink) -> None:
        self._buffers.add(buffer)

    def collect(self) -> Iterator[Metric]:
        buffers = list(self._buffers)
        yield CounterMetricFamily(
            "loraplane_audit_events_dropped",
            "Router audit events dropped because the buffer was full (PostgreSQL unreachable for long); "
            "never written.",
            value=sum(b.dropped for b in buffers),
        )
        yield GaugeMetricFamily(
            "loraplane_audit_events_buffered",
            "Router audit events waiting to be written to PostgreSQL.",
            value=sum(b.pending for b in buffers),
        )


_lock = threading.Lock()
_by_registry: weakref.WeakKeyDictionary[CollectorRegistry, AuditBufferMetrics] = weakref.WeakKeyDictionary()


def audit_buffer_metrics(registry: CollectorRegistry | None = None) -> AuditBufferMetrics:
    """The collector registered in ``registry`` (default: the global one), created once per registry."""
    reg = registry if registry is not None else REGISTRY
    with _lock:
        m = _by_registry.get(reg)
        if m is None:
            m = AuditBufferMetrics()
            reg.register(m)
            _by_registry[reg] = m
        return m


class RouterAudit:
    def __init__(self, sink: AuditSink, registry: CollectorRegistry | None = None) -> None:
        self._sink = sink
        if isinstance(sink, BufferedAuditSink):
            audit_buffer_metrics(registry).track(sink)

    async def event(self, action: str, adapter_id: str, details: dict[str, Any]) -> None:
        try:
            await self._sink.record(
                actor=ACTOR, action=action, subject_type="adapter", subject_id=adapter_id, details=details
            )
        except Exception as exc:  # the audit sink must never break routing
            log.warning("audit record failed", extra={"action": action, "error": str(exc)})
