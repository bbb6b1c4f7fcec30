"""An engine's in-band error inside a stream (issue 24.6): vLLM fails a stream that has started with
``data: {"error": …}`` then ``data: [DONE]`` on its HTTP 200. The gateway passes it on in its own
error shape and counts the request as failed everywhere: the access log (502 ``engine_error``),
the error metrics, no TTFT sample as a success, and the canary analyser's error count. Through
the gateway app on the real router and a simulator replica whose behaviour
``stream_error_rate`` makes those errors (no GPU needed)."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from registry.snapshot import RoutingSnapshot
from tests.router.routerkit import SIM_ARGS, Sim, put_version

from .gw_real import access_lines, real_gateway, with_canary

pytestmark = pytest.mark.xdist_group("gw-real")


@pytest.fixture(scope="module")
def sim() -> Iterator[Sim]:
    s = Sim(list(SIM_ARGS)).start()
    try:
        yield s
    finally:
        s.stop()


def _with_canary(snap: RoutingSnapshot, artifacts: Any, tmp_path: Path) -> RoutingSnapshot:
    v2 = put_version(artifacts, tmp_path, "se", "v2", seed=7, status="canary")
    return with_canary(snap, "se", v2, 50)


def _events(text: str) -> list[Any]:
    out: list[Any] = []
    for block in text.split("\n\n"):
        if block.startswith("data: "):
            payload = block.removeprefix("data: ")
            out.append(payload if payload == "[DONE]" else orjson.loads(payload))
    return out


async def test_an_engine_error_inside_a_stream_counts_as_an_error_everywhere(
    sim: Sim, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    sim.faults(reset=True, behaviours={"se@*": {"stream_error_rate": 1.0}})
    caplog.set_level(logging.INFO, logger="loraplane.gateway.access")
    body = {"model": "demo-base:se", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}
    async with real_gateway(tmp_path, [sim.url], ["se"], adjust=_with_canary) as g, g.client(timeout=30) as c:
        for _ in range(6):
            r = await c.post("/v1/chat/completions", json={**body, "stream": True})
            assert r.status_code == 200  # the stream had started: the status line was sent
            ev = _events(r.text)
            assert ev[-1] == "[DONE]"
            err = ev[-2]["error"]
            assert err["code"] == "engine_error" and err["type"] == "server_error", err
            assert "Simulated failure in the stream generator" in err["message"]
        assert access_lines(caplog.records) == [(502, "engine_error")] * 6
        assert g.metric("loraplane_gateway_errors_total", adapter="se", error="engine_error") == 6
        assert g.metric("loraplane_gateway_requests_total", adapter="se", code="502") == 6
        assert g.metric("loraplane_gateway_requests_total", adapter="se", code="200") == 0
        assert g.metric("loraplane_gateway_ttft_seconds_count", adapter="se") == 0
        arms = [await g.canary.read("se", v) for v in ("v1", "v2")]
        assert sum(a.requests for a in arms) == 6 and all(a.errors == a.requests for a in arms), arms

        # the same adapter streaming healthily: a success in each of those places
        sim.faults(behaviours={})
        caplog.clear()
        r = await c.post("/v1/chat/completions", json={**body, "stream": True})
        assert r.status_code == 200 and '"error"' not in r.text and r.text.endswith("data: [DONE]\n\n")
        assert access_lines(caplog.records) == [(200, None)]
        assert g.metric("loraplane_gateway_ttft_seconds_count", adapter="se") == 1
        arms = [await g.canary.read("se", v) for v in ("v1", "v2")]
        assert sum(a.requests - a.errors for a in arms) == 1
