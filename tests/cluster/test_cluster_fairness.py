"""Fairness under saturation (``router.fairness``) on real processes: PostgreSQL, Redis, S3, two
simulator replicas with few adapter slots and slow loads (``--slow-load-s``), one registry and
TWO gateway processes, one load at a time per replica (``max_loads_per_replica`` 1).

One heavy tenant floods cold requests (16 at a time, over 12 adapters that do not fit), and
light tenants each send a few requests for adapters loaded nowhere yet, through both gateways.
With virtual token counters the light tenants' loads go before the heavy tenant's backlog in
each gateway, and the gateways take turns at each replica's load slot: each light request waits
about one or two loads, not the flood's queue.
"""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from kit import localservices as ls
from tests.gateway.gw_platform import Platform, run_platform

pytestmark = [pytest.mark.cluster, pytest.mark.xdist_group("cluster")]

LOAD_S = 0.3  # the simulators' extra seconds per load
HEAVY_ADAPTERS = 16
HEAVY_CONCURRENCY = 16
LIGHT = ("lt0", "lt1", "lt2")
LIGHT_REQUESTS = 3  # each for its own cold adapter
MSG = [{"role": "user", "content": "hello"}]


@pytest.fixture(scope="module")
def plat(s3_server: ls.S3Server, redis_url: str) -> Iterator[Platform]:
    with run_platform(
        s3_server,
        redis_url,
        gateways=2,
        sims=2,
        sim_args=("--zero-latency", "--max-loras", "2", "--max-cpu-loras", "4", "--slow-load-s", str(LOAD_S)),
        pool={"max_loras": 2, "max_adapters": 4},
        env={
            "LORAPLANE_FAIRNESS": "vtc",
            "LORAPLANE_MAX_LOADS_PER_REPLICA": "1",
            "LORAPLANE_LOAD_TIMEOUT_S": "60",
            "LORAPLANE_PLAN_INTERVAL_S": "0",  # no placement plan: loads come from requests only
            "LORAPLANE_RETIRED_IDLE_UNLOAD_S": "3600",
        },
    ) as p:
        for t in ("heavy", *LIGHT):
            p.admin.create_tenant(t)
            p.keys[t] = p.admin.issue_key(t)["key"]
        before = _revisions(p)
        for i in range(HEAVY_ADAPTERS):
            p.adapter(f"hv-{i}")
            p.admin.put_grant("heavy", f"hv-{i}")
        for t in LIGHT:
            for j in range(LIGHT_REQUESTS):
                p.adapter(f"{t}-{j}")
                p.admin.put_grant(t, f"{t}-{j}")
        _settled(p, before)
        yield p


def _revisions(p: Platform) -> list[int]:
    return [int(httpx.get(f"{u}/readyz").json()["routing_table"]["revision"]) for u in p.gateway_urls]


def _settled(p: Platform, before: list[int], timeout: float = 20.0) -> None:
    """Every gateway's routing table moved past ``before`` and stopped moving."""
    deadline = time.monotonic() + timeout
    last = before
    while time.monotonic() < deadline:
        time.sleep(0.3)
        now = _revisions(p)
        if all(n > b for n, b in zip(now, before, strict=True)) and now == last:
            return
        last = now
    raise AssertionError("the gateways' routing tables did not take the new adapters")


def _chat(c: httpx.Client, p: Platform, gw: int, tenant: str, adapter: str) -> tuple[int, float, str]:
    body = {"model": f"demo-base:{adapter}", "messages": MSG, "max_tokens": 3}
    t0 = time.monotonic()
    r = c.post(
        f"{p.gateway_urls[gw % len(p.gateway_urls)]}/v1/chat/completions",
        json=body,
        headers={"authorization": f"Bearer {p.keys[tenant]}"},
    )
    code = "" if r.status_code == 200 else str(r.json().get("error", {}).get("code"))
    return r.status_code, time.monotonic() - t0, code


def _p99(xs: list[float]) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, round(0.99 * (len(s) - 1)))]


def test_light_tenants_wait_about_one_load_while_a_heavy_one_floods(plat: Platform) -> None:
    stop = threading.Event()
    heavy: list[tuple[int, float, str]] = []
    light: dict[str, list[tuple[int, float, str]]] = {t: [] for t in LIGHT}

    def flood(k: int) -> None:
        n = k
        with httpx.Client(timeout=90) as c:
            while not stop.is_set():
                heavy.append(_chat(c, plat, n, "heavy", f"hv-{n % HEAVY_ADAPTERS}"))
                n += HEAVY_CONCURRENCY + 1  # the next adapter along: nearly always a cold one

    def tenant(i: int, t: str) -> None:
        time.sleep(3.0 + 0.4 * i)  # the flood's queues have built up
        with httpx.Client(timeout=90) as c:
            for j in range(LIGHT_REQUESTS):
                light[t].append(_chat(c, plat, i + j, t, f"{t}-{j}"))
                time.sleep(0.5)

    with ThreadPoolExecutor(HEAVY_CONCURRENCY + len(LIGHT)) as ex:
        floods = [ex.submit(flood, k) for k in range(HEAVY_CONCURRENCY)]
        lights = [ex.submit(tenant, i, t) for i, t in enumerate(LIGHT)]
        for f in lights:
            f.result()
        time.sleep(2.0)
        stop.set()
        for f in floods:
            f.result()

    assert {(status, code) for status, _, code in heavy} == {(200, "")}, [h for h in heavy if h[0] != 200]
    for t in LIGHT:
        assert [status for status, _, _ in light[t]] == [200] * LIGHT_REQUESTS, (t, light[t])
    heavy_wait = [s for _, s, _ in heavy]
    light_wait = [s for t in LIGHT for _, s, _ in light[t]]
    heavy_p99, light_p99 = _p99(heavy_wait), _p99(light_wait)
    light_s = sorted(round(x, 2) for x in light_wait)
    heavy_p50, light_p50 = statistics.median(heavy_wait), statistics.median(light_wait)
    report = (
        f"heavy p50 {heavy_p50:.2f}s p99 {heavy_p99:.2f}s over {len(heavy_wait)}; "
        f"light p50 {light_p50:.2f}s, all {light_s}"
    )
    print(report)
    # saturated: the heavy tenant's requests queue behind several loads each
    assert heavy_p99 > 4 * LOAD_S, report
    # the light ones wait for a load slot or two, well below the flood's tail: fair order within
    # each gateway, and turns between the gateways at each replica's load slot (without the
    # turns, a gateway whose own load just ended claimed the slot again for its own queue, and a
    # light request behind the other gateway's flood waited as long as the heavy tail)
    assert light_p99 < 0.6 * heavy_p99, report
    assert light_p50 < heavy_p99 / 3, report
