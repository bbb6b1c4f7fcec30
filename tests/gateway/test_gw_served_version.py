"""A load-failure fallback (SPEC §15) is recorded with both versions (issue 24.12): the access log
line has ``version`` (asked for), ``served_version`` (what answered: a previous version, or
``base``) and ``fallback`` (its kind); ``loraplane_gateway_requests_total`` has a
``served_version`` label, and so has the router's ``loraplane_fallbacks_total``. Through the
gateway app on the real router and a simulator replica refusing the new version's load."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from registry.snapshot import RoutingSnapshot
from tests.router.routerkit import SIM_ARGS, Sim, http, put_version

from .gw_real import real_gateway

pytestmark = pytest.mark.xdist_group("gw-real")

MSG = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def sim() -> Iterator[Sim]:
    s = Sim(list(SIM_ARGS)).start()
    try:
        yield s
    finally:
        s.stop()


def _v2_over_v1(policy: str) -> Any:
    """``fb``: v2 active (``rollback_to`` v1, v1 retired), ``on_load_failure`` = ``policy``."""

    def adjust(snap: RoutingSnapshot, artifacts: Any, tmp_path: Path) -> RoutingSnapshot:
        a = snap.adapters["fb"]
        v1 = dataclasses.replace(a.versions["v1"], status="retired")
        v2 = dataclasses.replace(put_version(artifacts, tmp_path, "fb", "v2", seed=9), rollback_to="v1")
        fb = dataclasses.replace(
            a, versions={"v1": v1, "v2": v2}, active_version="v2", on_load_failure=policy
        )
        return dataclasses.replace(snap, adapters={**snap.adapters, "fb": fb})

    return adjust


def _access(records: list[logging.LogRecord]) -> list[dict[str, Any]]:
    keys = ("status", "version", "served_version", "fallback")
    return [{k: r.__dict__[k] for k in keys} for r in records if r.name == "loraplane.gateway.access"]


@pytest.mark.parametrize(("policy", "served"), [("previous_version", "v1"), ("base_model", "base")])
async def test_a_fallback_is_recorded_with_the_version_asked_for_and_the_one_served(
    sim: Sim, tmp_path: Path, caplog: pytest.LogCaptureFixture, policy: str, served: str
) -> None:
    sim.faults(reset=True)
    for name in sim.loaded():  # nothing resident from an earlier test
        http().post(f"{sim.url}/v1/unload_lora_adapter", json={"lora_name": name})
    async with real_gateway(tmp_path, [sim.url], ["fb"], adjust=_v2_over_v1(policy)) as g:
        caplog.set_level(logging.INFO, logger="loraplane.gateway.access")
        sim.faults(fail_loads=1, fail_load_status=500)  # v2's load is refused
        async with g.client(timeout=30) as c:
            r = await c.post("/v1/chat/completions", json={"model": "demo-base:fb", "messages": MSG})
            assert r.status_code == 200, r.text
            assert r.headers["x-loraplane-fallback"] == policy
            assert r.headers["x-loraplane-adapter-version"] == served
            sim.faults(reset=True)
            r = await c.post("/v1/chat/completions", json={"model": "demo-base:fb", "messages": MSG})
            assert r.status_code == 200 and "x-loraplane-fallback" not in r.headers
        assert _access(caplog.records) == [
            {"status": 200, "version": "v2", "served_version": served, "fallback": policy},
            {"status": 200, "version": "v2", "served_version": "v2", "fallback": None},
        ]
        asked = {"adapter": "fb", "version": "v2", "code": "200"}
        assert g.metric("loraplane_gateway_requests_total", **asked, served_version=served) == 1
        assert g.metric("loraplane_gateway_requests_total", **asked, served_version="v2") == 1
        fallbacks = g.router.metrics.fallbacks.labels(
            adapter="fb", version="v2", kind=policy, served_version=served
        )
        assert fallbacks._value.get() == 1
