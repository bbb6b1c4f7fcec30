"""Every writer notifies (SPEC §4, §19; DESIGN 24) on real processes: PostgreSQL, Redis, S3, two
simulator replicas, one ``serve --role registry`` and two ``serve --role gateway`` processes (each
runs a canary analyser; the Redis lease lets one act, so for its changes the other gateway is a
second process that must hear of them).

For each writer of adapter state — the admin API, the console, a bulk operation, an approval, the
canary analyser's abort and its auto-promotion — the change must be in force on BOTH gateways
within 1 s: the registry's revision (read from PostgreSQL) is reached by each gateway's routing
table (its ``/readyz`` revision), and the gateways then serve the new state. Before the analyser
wrote through the change writer, its abort reached the gateways only at their safety-net refresh
(``LORAPLANE_SNAPSHOT_REFRESH_S``, 15 s).
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest
import sqlalchemy as sa

from kit import localservices as ls
from kit.db import make_engine
from tests.gateway.gw_platform import ADMIN_TOKEN, Platform, run_platform

pytestmark = [pytest.mark.cluster, pytest.mark.xdist_group("cluster-writers")]

SPEC_S = 1.0  # SPEC §4: a change reaches every gateway within 1 s
BEHAVIOURS = {"w-bad@v2-*": {"error_rate": 0.9}}  # the canary the analyser must abort
MSG = [{"role": "user", "content": "hello"}]
V1 = "/admin/v1"


@pytest.fixture(scope="module")
def plat(s3_server: ls.S3Server, redis_url: str) -> Iterator[Platform]:
    prefix = ls.unique_redis_prefix("writers")
    try:
        with run_platform(
            s3_server,
            redis_url,
            gateways=2,
            sim_args=("--zero-latency", "--behaviours", json.dumps(BEHAVIOURS)),
            env={"LORAPLANE_REDIS_PREFIX": prefix, "LORAPLANE_OUTLIER_FAILURES": "1000"},
        ) as p:
            a = p.admin
            a.create_tenant("acme", limits={"rpm": 100000, "tpm": 100_000_000})
            for aid in ("w-api", "w-console", "w-bulk", "w-approval", "w-bad", "w-good"):
                p.adapter(aid, versions=2)
                a.put_grant("acme", aid)
            p.keys["acme"] = a.issue_key("acme")["key"]
            yield p
    finally:
        ls.flush_redis_prefix(redis_url, prefix)


class Revisions:
    """The registry's committed revision and each gateway's routing-table revision."""

    def __init__(self, p: Platform) -> None:
        self.p = p
        self.engine = make_engine(p.database_url)
        self.http = httpx.Client(timeout=5)

    def registry(self) -> int:
        with self.engine.connect() as conn:
            return int(conn.execute(sa.text("SELECT revision FROM registry_state WHERE id = 1")).scalar_one())

    def gateway(self, url: str) -> int:
        return int(self.http.get(f"{url}/readyz").json()["routing_table"]["revision"])

    def close(self) -> None:
        self.http.close()
        self.engine.dispose()


@pytest.fixture
def revs(plat: Platform) -> Iterator[Revisions]:
    r = Revisions(plat)
    yield r
    r.close()


def _settled(revs: Revisions, timeout_s: float = 30.0) -> int:
    """Wait until both gateways are at the registry's revision (nothing else in flight)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        rev = revs.registry()
        if all(revs.gateway(u) >= rev for u in revs.p.gateway_urls):
            return rev
        time.sleep(0.05)
    raise AssertionError("gateways did not settle on the registry's revision")


def _reach(revs: Revisions, target: int, since: float, timeout_s: float = 20.0) -> list[float]:
    """Seconds from ``since`` until each gateway's table is at ``target`` or later."""
    out = []
    for url in revs.p.gateway_urls:
        deadline = time.monotonic() + timeout_s
        while revs.gateway(url) < target and time.monotonic() < deadline:
            time.sleep(0.005)
        out.append(time.monotonic() - since)
    return out


def _after_a_write(revs: Revisions, write: Callable[[], Any]) -> list[float]:
    """Run a synchronous writer; how long until both gateways have its change."""
    before = _settled(revs)
    t0 = time.monotonic()
    write()
    target = revs.registry()
    assert target > before, "the writer changed nothing"
    return _reach(revs, target, t0)


def _after_a_commit_seen(revs: Revisions, before: int, timeout_s: float) -> tuple[list[float], int]:
    """For a writer that acts on its own (the analyser): watch the registry's revision, then how
    long from the moment it moved until both gateways have it."""
    deadline = time.monotonic() + timeout_s
    while (target := revs.registry()) <= before:
        assert time.monotonic() < deadline, "the writer never wrote"
        time.sleep(0.005)
    return _reach(revs, target, time.monotonic()), target


def _served(p: Platform, gw: str, aid: str) -> tuple[int, str | None]:
    r = httpx.post(
        f"{gw}/v1/chat/completions",
        headers={"authorization": f"Bearer {p.keys['acme']}"},
        json={"model": f"demo-base:{aid}", "messages": MSG, "max_tokens": 2},
        timeout=30,
    )
    return r.status_code, r.headers.get("x-loraplane-adapter-version")


def _console(p: Platform) -> httpx.Client:
    """A console session of the bootstrap admin."""
    c = httpx.Client(base_url=f"{p.admin_url}/admin/ui", timeout=10)
    pre = re.search(r'name="csrf" value="([^"]+)"', c.get("/signin").text)
    assert pre is not None
    r = c.post("/signin", data={"csrf": pre.group(1), "token": ADMIN_TOKEN})
    assert r.status_code in (200, 303), r.text
    return c


def test_the_admin_api_console_bulk_and_approvals_reach_both_gateways_within_1s(
    plat: Platform, revs: Revisions
) -> None:
    a, gws = plat.admin, plat.gateway_urls
    took: dict[str, list[float]] = {}

    took["admin API"] = _after_a_write(revs, lambda: a.promote("w-api", "v2"))
    assert {_served(plat, g, "w-api") for g in gws} == {(200, "v2")}

    console = _console(plat)
    try:
        page = console.get("/adapters/w-console").text
        csrf = re.search(r'name="csrf" value="([^"]+)"', page)
        assert csrf is not None

        def console_disable() -> None:
            r = console.post("/adapters/w-console/act", data={"csrf": csrf.group(1), "action": "disable"})
            assert r.status_code == 303 and "done=" in r.headers["location"], r.text

        took["console"] = _after_a_write(revs, console_disable)
    finally:
        console.close()
    assert {_served(plat, g, "w-console")[0] for g in gws} == {403}

    took["bulk"] = _after_a_write(
        revs, lambda: a.request("POST", "/bulk/disable", json_body={"selector": {"adapters": ["w-bulk"]}})
    )
    assert {_served(plat, g, "w-bulk")[0] for g in gws} == {403}

    a.request("PATCH", "/adapters/w-approval", json_body={"approvals_required": 1})
    a.create_principal("mia", "maintainer", ["e2e"])
    mia = a.issue_admin_token("mia")["token"]
    with httpx.Client(base_url=f"{plat.admin_url}{V1}", headers={"authorization": f"Bearer {mia}"}) as m:
        r = m.post("/adapters/w-approval/versions/v2/promote")
        assert r.status_code == 202, r.text
        pid = r.json()["id"]
    took["approval"] = _after_a_write(revs, lambda: a.approve_promotion(pid))
    assert {_served(plat, g, "w-approval") for g in gws} == {(200, "v2")}

    print("\nchange in force on both gateways (s):", {k: [round(x, 3) for x in v] for k, v in took.items()})
    for writer, times in took.items():
        assert max(times) < SPEC_S, (writer, times)


class Traffic:
    """Requests from 8 threads, alternating between the gateways, until stopped."""

    def __init__(self, p: Platform, aid: str) -> None:
        self.p, self.aid = p, aid
        self.stop = threading.Event()
        self.pool = ThreadPoolExecutor(8)
        self.futures = [self.pool.submit(self._run, i) for i in range(8)]

    def _run(self, worker: int) -> None:
        with httpx.Client(timeout=30, headers={"authorization": f"Bearer {self.p.keys['acme']}"}) as c:
            i = worker
            while not self.stop.is_set():
                i += 1
                c.post(
                    f"{self.p.gateway_urls[i % 2]}/v1/chat/completions",
                    json={
                        "model": f"demo-base:{self.aid}",
                        "messages": MSG,
                        "max_tokens": 2,
                        "user": f"u{i}",
                    },
                )

    def close(self) -> None:
        self.stop.set()
        for f in self.futures:
            f.result()
        self.pool.shutdown()


def test_the_canary_analysers_abort_and_promotion_reach_both_gateways_within_1s(
    plat: Platform, revs: Revisions
) -> None:
    a, gws = plat.admin, plat.gateway_urls
    took: dict[str, list[float]] = {}

    # abort: v2 answers 90 % errors (81 % after the router's retry) against v1's none
    a.request("PATCH", "/adapters/w-bad", json_body={"canary_policy": {"min_requests": 20, "window_s": 120}})
    a.promote("w-bad", "v2", canary_weight=50)
    before = _settled(revs)
    traffic = Traffic(plat, "w-bad")
    try:
        took["analyser abort"], _ = _after_a_commit_seen(revs, before, timeout_s=120)
    finally:
        traffic.close()
    [ev] = a.list_audit(action="version.canary_aborted", subject_id="w-bad")
    assert ev["actor"] == "canary-analyzer"
    assert a.get_adapter("w-bad")["canary_version"] is None
    assert {_served(plat, g, "w-bad") for g in gws for _ in range(10)} == {(200, "v1")}

    # auto-promotion: a healthy canary promoted after 3 s without breach
    policy = {"min_requests": 20, "window_s": 120, "auto_promote_after_s": 3}
    a.request("PATCH", "/adapters/w-good", json_body={"canary_policy": policy})
    a.promote("w-good", "v2", canary_weight=50)
    before = _settled(revs)
    traffic = Traffic(plat, "w-good")
    try:
        took["analyser promotion"], _ = _after_a_commit_seen(revs, before, timeout_s=120)
    finally:
        traffic.close()
    promoted = a.list_audit(action="version.promoted", subject_id="w-good")
    assert [e["actor"] for e in promoted][-1] == "canary-analyzer"
    assert {_served(plat, g, "w-good") for g in gws for _ in range(5)} == {(200, "v2")}

    print("\nchange in force on both gateways (s):", {k: [round(x, 3) for x in v] for k, v in took.items()})
    for writer, times in took.items():
        assert max(times) < SPEC_S, (writer, times)
