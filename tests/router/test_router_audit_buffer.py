"""The router's audit buffer while the database refuses writes: bounded, the oldest events dropped
first, drops counted in ``loraplane_audit_events_dropped_total`` and logged once, the backlog in
``loraplane_audit_events_buffered``; the kept events are written in order once writes work again."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from registry.audit_sink import BufferedAuditSink, MemoryAuditSink
from registry.storage.local import LocalArtifactStore
from router.audit import RouterAudit
from router.core import Router
from router.settings import RouterSettings


class Outage(MemoryAuditSink):
    """Keeps events like the memory sink, but refuses them while ``down`` (a database outage)."""

    def __init__(self) -> None:
        super().__init__()
        self.down = True

    async def record(
        self, *, actor: str, action: str, subject_type: str, subject_id: str, details: dict[str, Any]
    ) -> None:
        if self.down:
            raise ConnectionError("connection refused")
        await super().record(
            actor=actor, action=action, subject_type=subject_type, subject_id=subject_id, details=details
        )


def _value(registry: CollectorRegistry, name: str) -> float | None:
    return registry.get_sample_value(name)


async def test_a_full_buffer_drops_the_oldest_and_counts_them(caplog: pytest.LogCaptureFixture) -> None:
    registry = CollectorRegistry()
    inner = Outage()
    buffer = BufferedAuditSink(inner, capacity=3, retry_s=0.02)
    audit = RouterAudit(buffer, registry)
    assert _value(registry, "loraplane_audit_events_dropped_total") == 0
    assert _value(registry, "loraplane_audit_events_buffered") == 0

    with caplog.at_level(logging.ERROR, logger="loraplane.audit"):
        for i in range(5):
            await audit.event("adapter.loaded", f"a{i}", {"replica": "r1"})
        await asyncio.sleep(0.1)  # the writer has tried (and keeps retrying)
    assert _value(registry, "loraplane_audit_events_buffered") == 3
    assert _value(registry, "loraplane_audit_events_dropped_total") == 2
    full = [r for r in caplog.records if r.getMessage().startswith("audit buffer full")]
    assert len(full) == 1  # logged once for the two drops
    text = generate_latest(registry).decode()
    assert "loraplane_audit_events_dropped_total 2.0" in text
    assert "loraplane_audit_events_buffered 3.0" in text

    inner.down = False
    async with asyncio.timeout(5):
        while buffer.pending:
            await asyncio.sleep(0.01)
    assert [e["subject_id"] for e in inner.events] == ["a2", "a3", "a4"]  # the newest, in order
    assert _value(registry, "loraplane_audit_events_buffered") == 0
    assert _value(registry, "loraplane_audit_events_dropped_total") == 2  # a counter never goes back
    await buffer.close()


async def test_router_exports_its_buffer_in_its_registry(tmp_path: Path) -> None:
    registry = CollectorRegistry()
    inner = Outage()
    buffer = BufferedAuditSink(inner, capacity=2, retry_s=0.02)
    settings = RouterSettings(pools=[], data_dir=tmp_path / "data")
    Router(settings, store=LocalArtifactStore(tmp_path / "a"), audit=buffer, registry=registry)
    for i in range(3):
        await buffer.record(actor="router", action="adapter.loaded", subject_type="adapter",
                            subject_id=f"a{i}", details={})  # fmt: skip
    assert _value(registry, "loraplane_audit_events_dropped_total") == 1
    assert _value(registry, "loraplane_audit_events_buffered") == 2
    # a second router on the same registry (tests, ``loraplane up``) shares the collector: sums
    other = BufferedAuditSink(Outage(), capacity=1, retry_s=0.02, close_timeout_s=0.1)
    Router(settings, store=LocalArtifactStore(tmp_path / "b"), audit=other, registry=registry)
    for i in range(2):
        await other.record(actor="router", action="adapter.loaded", subject_type="adapter",
                           subject_id=f"b{i}", details={})  # fmt: skip
    assert _value(registry, "loraplane_audit_events_dropped_total") == 2
    assert _value(registry, "loraplane_audit_events_buffered") == 3
    inner.down = False
    await buffer.close()
    await other.close()  # its database stays down: gives up after close_timeout_s


async def test_an_unbuffered_sink_exports_no_buffer_series() -> None:
    registry = CollectorRegistry()
    RouterAudit(MemoryAuditSink(), registry)
    assert _value(registry, "loraplane_audit_events_dropped_total") is None
