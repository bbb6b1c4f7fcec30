"""The placement plan across processes (issue 28): two ``loraplane serve --role gateway``
processes and a ``--role registry`` process sharing Redis, the controller on every 0.5 s. The
chore leader (one of the gateways) plans from both gateways' counts and publishes the plan; the
registry's admin API (``GET /admin/v1/replicas/plan``, ``RedisReplicaDirectory``) serves it —
the adapter that got traffic, with its forecast demand, its planned replicas (real simulator
URLs) and where it is loaded — and both gateways export the same plan's gauges."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from kit import localservices as ls
from tests.gateway.gw_platform import Platform, run_platform

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("gw-plan")]


@pytest.fixture(scope="module")
def plat(s3_server: ls.S3Server, redis_url: str) -> Iterator[Platform]:
    with run_platform(s3_server, redis_url, gateways=2, env={"LORAPLANE_PLAN_INTERVAL_S": "0.5"}) as p:
        p.adapter("alpha")
        p.adapter("idle")
        p.admin.create_tenant("acme", base_model_access=True)
        p.admin.put_grant("acme", "alpha")
        p.keys["acme"] = p.admin.issue_key("acme")["key"]
        yield p


def _chat(p: Platform, gateway: str) -> int:
    r = httpx.post(
        f"{gateway}/v1/chat/completions",
        headers={"authorization": f"Bearer {p.keys['acme']}"},
        json={"model": "demo-base:alpha", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
        timeout=30,
    )
    return r.status_code


def _gauge(text: str, name: str, adapter: str) -> float | None:
    m = re.search(rf'^{name}\{{adapter="{adapter}",version="v1"\}} ([0-9.e+-]+)$', text, re.M)
    return float(m.group(1)) if m else None


def test_the_plan_the_leader_publishes_is_served_by_the_admin_api(plat: Platform) -> None:
    deadline = time.monotonic() + 15  # the key reaches the gateways through the change feed
    while any(_chat(plat, g) != 200 for g in plat.gateway_urls):
        assert time.monotonic() < deadline, "the tenant's key never worked"
        time.sleep(0.1)
    plan: dict[str, Any] = {}
    row: dict[str, Any] | None = None
    deadline = time.monotonic() + 30
    while row is None or not row["current"]:
        assert time.monotonic() < deadline, plan
        for g in plat.gateway_urls:  # traffic through both gateways: the leader sums the board
            assert _chat(plat, g) == 200
        plan = plat.admin.replica_plan()
        row = next((a for a in plan["adapters"] if a["adapter"] == "alpha"), None)
        time.sleep(0.2)
    assert plan["published"] is True and plan["age_s"] < 10
    assert plan["desired_replicas"]["sim"] >= 1  # the autoscaling signal of the pool
    assert row["version"] == "v1" and row["lora_name"].startswith("alpha@v1")
    assert row["demand_rps"] > 0 and row["planned_replicas"] >= 1
    assert set(row["targets"]) <= set(plat.sim_urls) and len(row["targets"]) == row["planned_replicas"]
    assert {c["url"] for c in row["current"]} <= set(plat.sim_urls)
    assert all(a["adapter"] != "idle" for a in plan["adapters"])  # no traffic, not hot: not planned
    # both gateways apply the published plan: the leader's and the follower's gauges agree with it
    # (each reads the plan on its own tick, so a gateway may still show the previous plan for a moment)
    for internal in plat.internal_urls:
        deadline = time.monotonic() + 10
        text = httpx.get(f"{internal}/metrics").text
        while _gauge(text, "loraplane_adapter_planned_replicas", "alpha") is None:
            assert time.monotonic() < deadline, text[-2000:]
            time.sleep(0.2)
            text = httpx.get(f"{internal}/metrics").text
        assert (_gauge(text, "loraplane_adapter_planned_replicas", "alpha") or 0) >= 1, text[-2000:]
        assert (_gauge(text, "loraplane_adapter_demand_rps", "alpha") or 0) > 0
        assert re.search(r'^loraplane_pool_desired_replicas\{pool="sim"\} [1-9]', text, re.M)
