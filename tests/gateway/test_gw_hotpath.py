"""Hot-path shortcuts keep their behaviour: the access-log line, the forward's deadline timer,
the cold-load gate."""

from __future__ import annotations

import asyncio
import gc
import io
import logging
import re
import time
from typing import Any

import orjson
import pytest

from gateway.errors import GatewayError
from gateway.service import ColdLoadGate
from kit.logs import JsonFormatter, log_record
from registry.snapshot import VersionInfo

from .test_gw_api_unit import Env, err


def _reference_format(record: logging.LogRecord) -> str:
    """The formatter before the per-second timestamp cache."""
    reserved = set(vars(logging.LogRecord("x", 0, "x", 0, "x", None, None))) | {"message", "asctime"}
    out: dict[str, Any] = {
        "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
        "level": record.levelname.lower(),
        "logger": record.name,
        "msg": record.getMessage(),
    }
    for key, value in record.__dict__.items():
        if key not in reserved and not key.startswith("_"):
            out[key] = value
    return orjson.dumps(out, default=str).decode()


def test_json_formatter_matches_the_reference_across_seconds() -> None:
    fmt = JsonFormatter()
    log = logging.getLogger("loraplane.test.fmt")
    for created in (1795950000.0, 1795950000.999, 1795950001.0005, 1795950001.5, 1795949999.25, 2.5):
        rec = log.makeRecord(log.name, logging.INFO, "f", 1, "hello %s", ("x",), None, extra={"a": 1})
        rec.created = created
        rec.msecs = int((created - int(created)) * 1000) + 0.0
        assert fmt.format(rec) == _reference_format(rec)


def test_log_record_is_log_info_without_the_caller() -> None:
    log = logging.getLogger("loraplane.test.fast")
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter())
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    log.propagate = False
    try:
        log_record(log, logging.INFO, "request", {"status": 200, "tenant": None})
        log.info("request", extra={"status": 200, "tenant": None})
        log_record(log, logging.DEBUG, "hidden", {})
        a, b = (orjson.loads(line) for line in stream.getvalue().splitlines())
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", a.pop("ts"))
        b.pop("ts")
        assert (
            a
            == b
            == {
                "level": "info",
                "logger": "loraplane.test.fast",
                "msg": "request",
                "status": 200,
                "tenant": None,
            }
        )
    finally:
        log.removeHandler(handler)


async def test_access_log_line_fields() -> None:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter())
    log = logging.getLogger("loraplane.gateway.access")
    old_level, old_propagate = log.level, log.propagate
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    log.propagate = False
    e = Env()
    await e.gw.start()
    try:
        r = await e.chat("demo-base:alpha", stream=True)
        assert r.status_code == 200
        r = await e.client.post(
            "/v1/chat/completions",
            json={"model": "demo-base:alpha", "messages": [{"role": "user", "content": "hi"}]},
            headers=e.h(**{"x-request-id": "rid-1"}),
        )
        assert r.status_code == 200
    finally:
        log.removeHandler(handler)
        log.setLevel(old_level)
        log.propagate = old_propagate
        await e.gw.stop()
    lines = [orjson.loads(x) for x in stream.getvalue().splitlines()]
    assert len(lines) == 2
    keys = [
        "ts", "level", "logger", "msg", "request_id", "endpoint", "tenant", "model", "adapter", "version",
        "served_version", "fallback", "replica", "status", "error", "stream", "latency_ms", "ttft_ms",
        "queue_ms", "prompt_tokens", "completion_tokens", "cold_load",
    ]  # fmt: skip
    assert [list(x) for x in lines] == [keys, keys]
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", lines[0]["ts"])
    streamed, plain = lines
    assert streamed["stream"] is True and streamed["ttft_ms"] is not None
    assert plain["request_id"] == "rid-1" and plain["status"] == 200 and plain["error"] is None
    assert plain["tenant"] == "acme" and plain["model"] == "demo-base:alpha" and plain["msg"] == "request"
    assert plain["served_version"] == plain["version"] and plain["fallback"] is None


async def test_deadline_timer_is_gone_after_a_fast_answer() -> None:
    e = Env(request_timeout_s=0.05)
    await e.gw.start()
    r = await e.chat("demo-base:alpha")  # runs in this task (ASGI transport)
    assert r.status_code == 200
    await asyncio.sleep(0.15)  # a timer left behind would cancel this task now
    task = asyncio.current_task()
    assert task is not None and task.cancelling() == 0
    e.router.forward_delay = 1.0
    r = await e.chat("demo-base:alpha")
    assert r.status_code == 504 and err(r)["code"] == "upstream_timeout"
    assert task.cancelling() == 0  # the 504's cancellation was taken back
    await e.gw.stop()


async def test_cancellation_from_outside_is_not_a_504() -> None:
    e = Env(request_timeout_s=5)
    await e.gw.start()
    e.router.forward_delay = 1.0
    t = asyncio.create_task(e.chat("demo-base:alpha"))
    await asyncio.sleep(0.05)
    t.cancel()
    with pytest.raises(asyncio.CancelledError):
        await t
    await e.gw.stop()


def _version(adapter_id: str) -> VersionInfo:
    return VersionInfo(
        adapter_id=adapter_id, version="v1", number=1, status="active", rank=8, lora_alpha=16.0,
        target_modules=("q_proj",), files=(), storage_uri="file:///x/", base_model="demo-base",
    )  # fmt: skip


def test_cold_gate_counts_only_cold_versions() -> None:
    warm, cold = _version("warm"), _version("cold")
    gate = ColdLoadGate(2, lambda name: name == warm.lora_name)
    with gate.enter(None), gate.enter(warm):
        assert gate.waiting == {}
    with gate.enter(cold):
        assert gate.waiting == {"cold": 1}
        with gate.enter(cold):
            assert gate.waiting == {"cold": 2}
            with pytest.raises(GatewayError) as ei, gate.enter(cold):
                pass
            assert ei.value.status == 503 and ei.value.code == "no_capacity"
    assert gate.waiting == {}


def test_cold_gate_follows_the_routers_residency_both_ways() -> None:
    resident: set[str] = set()
    gate = ColdLoadGate(1, resident.__contains__)
    v = _version("alpha")
    with gate.enter(v):
        assert gate.waiting == {"alpha": 1}  # nowhere resident: cold
    resident.add(v.lora_name)
    with gate.enter(v):
        assert gate.waiting == {}
    resident.discard(v.lora_name)  # evicted everywhere: cold again (not warm forever)
    with gate.enter(v):
        assert gate.waiting == {"alpha": 1}


def test_settle_heap_freezes_and_raises_the_young_threshold() -> None:
    from gateway.serving import GC_YOUNG_THRESHOLD, settle_heap

    before = gc.get_threshold()
    try:
        settle_heap()
        assert gc.get_freeze_count() > 0
        assert gc.get_threshold() == (max(before[0], GC_YOUNG_THRESHOLD), before[1], before[2])
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)


async def test_lifespan_settles_the_heap_once_started(monkeypatch: pytest.MonkeyPatch) -> None:
    import gateway.serving
    from gateway.api import create_gateway_app

    calls: list[int] = []
    monkeypatch.setattr(gateway.serving, "settle_heap", lambda: calls.append(1))
    e = Env()
    app = create_gateway_app(e.gw)
    inbox = [{"type": "lifespan.startup"}, {"type": "lifespan.shutdown"}]
    sent: list[str] = []

    async def receive() -> dict[str, Any]:
        return inbox.pop(0)

    async def send(msg: Any) -> None:
        sent.append(msg["type"])
        if msg["type"] == "lifespan.startup.complete":
            assert calls == [1]  # settled before the server takes requests

    await app({"type": "lifespan"}, receive, send)
    assert sent == ["lifespan.startup.complete", "lifespan.shutdown.complete"] and calls == [1]
