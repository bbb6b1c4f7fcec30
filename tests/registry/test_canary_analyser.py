"""The canary analyser against a real registry database (SQLite and PostgreSQL), with the
gateway's in-process counters (SPEC §16): a canary with more errors is cleared by itself with its
evidence in the audit event; a healthy one is promoted after ``auto_promote_after_s`` — or put up
for approval where approvals are required, once; a canary never judged is never promoted."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

from fastapi.testclient import TestClient
from prometheus_client import CollectorRegistry

from gateway.canary import MemoryCanaryCounters
from registry.canary.analyser import CanaryAnalyser
from registry.canary.lease import LocalLease
from registry.canary.metrics import CanaryMetrics
from tests.registry.core_support import add_versions, seed_adapter, statuses

V1 = "/admin/v1"


class Clock:
    def __init__(self) -> None:
        self.shift = 0.0

    def __call__(self) -> float:
        return time.time() + self.shift


def _setup(
    client: TestClient, factory: Any, policy: dict[str, Any]
) -> tuple[CanaryAnalyser, MemoryCanaryCounters, Clock]:
    seed_adapter(client)
    add_versions(factory, "support", 2)
    assert client.post(f"{V1}/adapters/support/versions/v1/promote").status_code == 200
    assert client.patch(f"{V1}/adapters/support", json={"canary_policy": policy}).status_code == 200
    r = client.post(f"{V1}/adapters/support/versions/v2/promote", json={"canary_weight": 20})
    assert r.status_code == 200, r.text
    counters, clock = MemoryCanaryCounters(), Clock()
    analyser = CanaryAnalyser(
        session_factory=factory, counters=counters, lease=LocalLease(), promotion_ttl_s=3600,
        metrics=CanaryMetrics(CollectorRegistry()), clock=clock,
    )  # fmt: skip
    return analyser, counters, clock


def _feed(counters: MemoryCanaryCounters, version: str, n: int, errors: int, ttft_s: float = 0.05) -> None:
    for i in range(n):
        if i < errors:
            counters.record("support", version, 502, ttft_s)
        else:
            counters.record("support", version, 200, ttft_s * (1 + (i % 7) / 10))
    counters.record("support", version, 429, None)  # the client's own limits: not counted
    counters.record("support", version, 499, None)  # gone before the answer: not counted


def _events(client: TestClient, action: str) -> list[dict[str, Any]]:
    return list(client.get(f"{V1}/audit", params={"action": action}).json()["data"])


def test_a_worse_canary_is_aborted_with_its_evidence(client: TestClient, factory: Any) -> None:
    analyser, counters, _ = _setup(client, factory, {"min_requests": 100, "window_s": 300})
    asyncio.run(analyser.run_once())  # the window starts: its baseline
    _feed(counters, "v2", 400, 28)  # 7 %
    _feed(counters, "v1", 1600, 16)  # 1 %
    asyncio.run(analyser.run_once())
    st = statuses(client, "support")
    assert st["canary"] is None and st["active"] == "v1"
    assert st["versions"]["v2"][0] == "ready"
    [ev] = _events(client, "version.canary_aborted")
    assert ev["actor"] == "canary-analyzer"
    d = ev["details"]
    assert d["version"] == "v2" and d["active_version"] == "v1" and d["reasons"] == ["error_rate"]
    assert (
        d["canary"]["requests"] == 400 and d["canary"]["errors"] == 28 and d["canary"]["error_rate"] == 0.07
    )
    assert d["active"]["requests"] == 1600 and d["active"]["errors"] == 16
    assert d["tests"]["error_rate"]["p_value"] < d["alpha"] <= 0.01
    assert d["policy"]["min_requests"] == 100
    # nothing left to watch
    asyncio.run(analyser.run_once())
    assert len(_events(client, "version.canary_aborted")) == 1


def test_no_look_before_min_requests_and_traffic_before_the_window_does_not_count(
    client: TestClient, factory: Any
) -> None:
    analyser, counters, _ = _setup(client, factory, {"min_requests": 100})
    _feed(counters, "v2", 500, 100)  # before the analyser saw the canary: the baseline absorbs it
    _feed(counters, "v1", 500, 0)
    asyncio.run(analyser.run_once())
    _feed(counters, "v2", 99, 50)  # awful, but under min_requests
    _feed(counters, "v1", 400, 0)
    asyncio.run(analyser.run_once())
    assert statuses(client, "support")["canary"] == "v2"


def test_a_healthy_canary_is_promoted_after_auto_promote_after_s(client: TestClient, factory: Any) -> None:
    analyser, counters, clock = _setup(client, factory, {"min_requests": 100, "auto_promote_after_s": 60})
    asyncio.run(analyser.run_once())
    clock.shift = 120  # time enough, but never judged: no promotion yet
    asyncio.run(analyser.run_once())
    assert statuses(client, "support")["canary"] == "v2"
    _feed(counters, "v2", 200, 2)
    _feed(counters, "v1", 800, 8)
    asyncio.run(analyser.run_once())
    st = statuses(client, "support")
    assert st["active"] == "v2" and st["canary"] is None
    [ev] = _events(client, "version.promoted")[-1:]
    assert ev["actor"] == "canary-analyzer" and ev["details"]["version"] == "v2"


def test_where_approvals_are_required_one_request_is_filed(client: TestClient, factory: Any) -> None:
    analyser, counters, _ = _setup(client, factory, {"min_requests": 100, "auto_promote_after_s": 0})
    assert client.patch(f"{V1}/adapters/support", json={"approvals_required": 1}).status_code == 200
    asyncio.run(analyser.run_once())
    _feed(counters, "v2", 200, 0)
    _feed(counters, "v1", 800, 0)
    for _ in range(3):
        asyncio.run(analyser.run_once())
    pending = client.get(f"{V1}/promotions", params={"status": "pending"}).json()["data"]
    assert len(pending) == 1
    assert pending[0]["requested_by"] == "canary-analyzer" and pending[0]["version"] == "v2"
    assert statuses(client, "support")["canary"] == "v2"  # nothing served changes before approval


def _answer(text: str) -> bytes:
    return json.dumps({"choices": [{"index": 0, "message": {"role": "assistant", "content": text}}]}).encode()


def test_sampled_answers_failing_the_format_checks_abort_the_canary(client: TestClient, factory: Any) -> None:
    analyser, counters, _ = _setup(client, factory, {"min_requests": 100})
    case = {"id": "c1", "prompt": "order?", "checks": [{"type": "json_schema", "schema": {"type": "object"}}]}
    r = client.put(f"{V1}/adapters/support/regression-set", json=[case])
    assert r.status_code in (200, 201), r.text
    asyncio.run(analyser.run_once())
    for i in range(200):  # the canary answers broken JSON one time in four; no 5xx anywhere
        bad = i % 4 == 0
        counters.record("support", "v2", 200, 0.05, answer=_answer('{"id": ' if bad else '{"id": 1}'))
    for _ in range(800):
        counters.record("support", "v1", 200, 0.05, answer=_answer('{"id": 1}'))
    asyncio.run(analyser.run_once())
    [ev] = _events(client, "version.canary_aborted")
    d = ev["details"]
    assert d["reasons"] == ["format_checks"]
    fc = d["tests"]["format_checks"]
    assert fc["canary"] == {"checked": 200, "failed": 50, "failure_rate": 0.25}
    assert fc["active"]["checked"] == 200 and fc["active"]["failed"] == 0  # 200 taken per tick
    assert d["tests"]["error_rate"]["breach"] is False


def test_a_fallback_answer_is_an_error_of_the_version_asked_for() -> None:
    counters = MemoryCanaryCounters()
    counters.record("support", "v2", 200, 0.05, other_version=True, answer=_answer("{}"))
    counters.record("support", "v2", 200, 0.05, answer=b"not json")
    got = asyncio.run(counters.read("support", "v2"))
    assert (got.requests, got.errors) == (2, 1)
    assert asyncio.run(counters.take_answers("support", "v2", 10)) == []  # neither is a sample
