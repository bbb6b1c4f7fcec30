"""Format checks in canary analysis are bounded per answer and isolated per adapter (issue 24.4):
a catastrophically backtracking pattern — as a ``regex`` check or as a JSON Schema ``pattern`` —
is cut off within a bound, and one adapter's slow answers do not delay another adapter's
analysis. Real registry database (both dialects), the gateway's in-process counters, real check
worker processes."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import pytest
from fastapi.testclient import TestClient
from prometheus_client import CollectorRegistry

from gateway.canary import MemoryCanaryCounters
from registry.canary.analyser import CanaryAnalyser
from registry.canary.lease import LocalLease
from registry.canary.metrics import CanaryMetrics
from registry.quality.checks import ANSWER_DEADLINE_S
from tests.registry.core_support import add_versions, seed_adapter, statuses

V1 = "/admin/v1"
SLOW = r"^(a|aa)+$"  # exponential for stdlib re and for the regex package alike
SLOW_TEXT = "a" * 36 + "!"  # stdlib re: ~15 s; the regex package: past its 1 s timeout


def _answer(text: str) -> bytes:
    return json.dumps({"choices": [{"index": 0, "message": {"role": "assistant", "content": text}}]}).encode()


def _canary(client: TestClient, factory: Any, adapter_id: str, checks: list[dict[str, Any]]) -> None:
    seed_adapter(client, adapter_id)
    add_versions(factory, adapter_id, 2)
    assert client.post(f"{V1}/adapters/{adapter_id}/versions/v1/promote").status_code == 200
    r = client.patch(f"{V1}/adapters/{adapter_id}", json={"canary_policy": {"min_requests": 100}})
    assert r.status_code == 200, r.text
    case = {"id": "c1", "prompt": "order?", "checks": checks}
    r = client.put(f"{V1}/adapters/{adapter_id}/regression-set", json=[case])
    assert r.status_code in (200, 201), r.text
    r = client.post(f"{V1}/adapters/{adapter_id}/versions/v2/promote", json={"canary_weight": 20})
    assert r.status_code == 200, r.text


def _analyser(factory: Any, counters: MemoryCanaryCounters, tick_s: float = 1.0) -> CanaryAnalyser:
    return CanaryAnalyser(
        session_factory=factory, counters=counters, lease=LocalLease(), promotion_ttl_s=3600,
        metrics=CanaryMetrics(CollectorRegistry()), tick_s=tick_s,
    )  # fmt: skip


def _aborted(client: TestClient) -> list[dict[str, Any]]:
    r = client.get(f"{V1}/audit", params={"action": "version.canary_aborted"})
    return list(r.json()["data"])


@pytest.mark.slow
@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)  # nothing here depends on the dialect
@pytest.mark.parametrize(
    ("checks", "text"),
    [
        ([{"type": "regex", "pattern": SLOW}], SLOW_TEXT),
        ([{"type": "json_schema", "schema": {"type": "string", "pattern": SLOW}}], json.dumps(SLOW_TEXT)),
        (  # additionalProperties beside patternProperties: jsonschema matches with stdlib re there
            [
                {
                    "type": "json_schema",
                    "schema": {"patternProperties": {r"^(a+)+$": {}}, "additionalProperties": False},
                },
            ],
            json.dumps({"a" * 28 + "!": 1}),  # stdlib re: ~9 s
        ),
    ],
    ids=["regex", "json_schema-pattern", "json_schema-additionalProperties"],
)
def test_a_catastrophic_pattern_is_cut_off_within_the_answer_deadline(
    client: TestClient, factory: Any, checks: list[dict[str, Any]], text: str
) -> None:
    _canary(client, factory, "support", checks)
    counters = MemoryCanaryCounters()
    analyser = _analyser(factory, counters)

    async def main() -> tuple[float, tuple[int, int]]:
        await analyser.run_once()  # the window's baseline
        for _ in range(2):
            counters.record("support", "v2", 200, 0.05, answer=_answer(text))
        t0 = time.monotonic()
        await analyser.run_once()
        took = time.monotonic() - t0
        [watch] = analyser._watches.values()  # the window's check counts
        await analyser.stop()
        return took, (watch.checks.canary_checked, watch.checks.canary_failed)

    took, (checked, failed) = asyncio.run(main())
    assert (checked, failed) == (2, 2)  # each answer checked, and failed
    # two answers, each cut off at its deadline (+ the pool's grace), and a worker's start on a
    # loaded machine (measured 6.4-6.8 s at load 7; unbounded, stdlib re took ≥ 9 s per answer)
    assert took < 2 * (ANSWER_DEADLINE_S + 0.5) + 8.0, took


@pytest.mark.slow
def test_a_slow_answer_of_one_adapter_does_not_delay_another_adapters_analysis(
    client: TestClient, factory: Any
) -> None:
    """Adapter ``aaa`` (analysed first: by id) has 12 answers whose regex check runs to its
    timeout (≥ 1 s of CPU each: ≥ 12 s in all); ``bbb``'s canary answers broken JSON one time in
    four and must be aborted on its format checks long before ``aaa``'s checks are done."""
    _canary(client, factory, "aaa", [{"type": "regex", "pattern": SLOW}])
    _canary(client, factory, "bbb", [{"type": "json_schema", "schema": {"type": "object"}}])
    counters = MemoryCanaryCounters()
    analyser = _analyser(factory, counters, tick_s=0.2)

    async def main() -> tuple[float, int]:
        await analyser.run_once()  # both windows' baselines
        for _ in range(12):
            counters.record("aaa", "v2", 200, 0.05, answer=_answer(SLOW_TEXT))
        for _ in range(150):
            counters.record("aaa", "v1", 200, 0.05, answer=_answer("aa"))
        for i in range(200):
            bad = i % 4 == 0
            counters.record("bbb", "v2", 200, 0.05, answer=_answer('{"id": ' if bad else '{"id": 1}'))
        for _ in range(800):
            counters.record("bbb", "v1", 200, 0.05, answer=_answer('{"id": 1}'))
        t0 = time.monotonic()
        analyser.start()
        try:
            while not await asyncio.to_thread(_aborted, client):
                assert time.monotonic() - t0 < 60, "bbb was never aborted"
                await asyncio.sleep(0.05)
            took = time.monotonic() - t0
            watch = next(w for k, w in analyser._watches.items() if k[0] == "aaa")
            return took, watch.checks.canary_checked
        finally:
            await analyser.stop()

    took, aaa_checked = asyncio.run(main())
    [ev] = _aborted(client)
    assert ev["subject_id"] == "bbb" and ev["details"]["reasons"] == ["format_checks"]
    assert statuses(client, "bbb")["canary"] is None and statuses(client, "aaa")["canary"] == "v2"
    # bbb's verdict came while aaa's slow answers were still being checked (≥ 1 s each)
    assert aaa_checked < 12, aaa_checked
    assert took < 8.0, took
