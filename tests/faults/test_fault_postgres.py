"""PostgreSQL faults (SPEC §18) under steady mixed traffic through two gateway processes, on a
PostgreSQL server of the test's own (never the suite's shared one):

- PostgreSQL stopped, then started again: the gateways keep serving from their last routing
  snapshot (every request succeeds, a cold load of an adapter never loaded before included), the
  admin API answers 503 ``database_unavailable`` within a bound, ``/readyz`` stays 200 with the
  stale warning and a growing snapshot age (``loraplane_snapshot_age_seconds`` too); once it is
  back the admin API works again without restarting any process, the router's buffered
  ``adapter.loaded`` event is written, and a kill switch reaches both gateways;
- PostgreSQL hung (SIGSTOP), then resumed (SIGCONT): the same, bounded — admin calls answer 503
  ``database_unavailable`` instead of hanging, and a cold load that must evict an adapter does
  not wait on the unload's audit write; after SIGCONT everything recovers and the buffered events
  are written (a SIGSTOP of the postmaster and of every backend: ``OwnService.hang``);
- a gateway SIGTERMed while its audit events wait for a hung database: it keeps trying for the
  buffer's close timeout, writes them once the database answers, and exits 0;
- below the platform: an engine with ``timeout_s`` on a hung server fails in bounded time and
  works again after SIGCONT.

Every request sent is counted: sent = succeeded + failed with a designed error (none is designed
here: the replicas are healthy); no truncated stream, no hang, no 500.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from typing import Any

import httpx
import pytest
import sqlalchemy as sa
from sqlalchemy.exc import OperationalError

from kit import localservices as ls
from kit.db import make_engine
from tests.gateway.gw_platform import ADMIN_TOKEN, Platform, run_platform

from .harness import MSG, OwnService, Traffic, metric_sum, own_postgres, seed, wait_served, wait_until

pytestmark = [pytest.mark.faults, pytest.mark.xdist_group("faults-postgres")]

DB_TIMEOUT_S = 1.5  # LORAPLANE_DATABASE_TIMEOUT_S of every process here
# an admin call while the database is down or hung answers within this: on a hung server the
# pool's ping of a pooled connection (DB_TIMEOUT_S), then one new connection (libpq's
# connect_timeout, whole seconds, at least 2), plus a margin for a busy machine
ADMIN_BOUND_S = DB_TIMEOUT_S + 2 + 1.5
COLD_BOUND_S = 10.0  # a cold load (with an eviction) while the database is down or hung
BOUND_S = 20.0  # no traffic request may take longer
# concurrent admin calls: more than the pool's 30 connections, fewer than the admin API's 40 worker
# threads; they share two busy cores, so their bound is looser than one call's
BURST = 35
BURST_BOUND_S = 3 * ADMIN_BOUND_S
STALE_WITHIN_S = 15.0  # the gateways' revision check gives up on a hung database after 10 s
ENV = {
    "LORAPLANE_SNAPSHOT_REFRESH_S": "1",
    "LORAPLANE_DATABASE_TIMEOUT_S": str(DB_TIMEOUT_S),
}


@dataclass
class Setup:
    p: Platform
    pg: OwnService
    models: list[str]  # traffic uses the first two; the others are cold (never requested)

    @property
    def key(self) -> str:
        return self.p.keys["acme"]


def platform(
    s3: ls.S3Server, redis_url: str, pool: dict[str, int] | None = None, sims: int = 3
) -> Iterator[Setup]:
    with own_postgres() as pg:
        try:
            with run_platform(s3, redis_url, gateways=2, sims=sims, pg_base=pg.url, env=ENV, pool=pool) as p:
                models = seed(p, adapters=5)
                wait_served(p, p.keys["acme"], models[:2])
                try:
                    yield Setup(p, pg, models)
                finally:
                    pg.ensure_up()  # the platform drops its database on the way out
        finally:
            pg.ensure_up()


@pytest.fixture
def plat(s3_server: ls.S3Server, redis_url: str) -> Iterator[Setup]:
    yield from platform(s3_server, redis_url)


@pytest.fixture
def small_pool(s3_server: ls.S3Server, redis_url: str) -> Iterator[Setup]:
    """One adapter per replica: three replicas, two traffic adapters and a third warmed up, so
    every further cold load must evict one."""
    yield from platform(s3_server, redis_url, pool={"max_loras": 1, "max_adapters": 1})


@pytest.fixture
def one_replica(s3_server: ls.S3Server, redis_url: str) -> Iterator[Setup]:
    yield from platform(s3_server, redis_url, sims=1)


# --------------------------------------------------------------------------- probes


def admin_call(p: Platform, method: str = "GET", path: str = "/adapters") -> tuple[int, str | None, float]:
    """(status, error code, seconds) of one admin API call, with a client timeout well past the
    bound so a hang shows as a long time, not as a client error."""
    t0 = time.monotonic()
    r = httpx.request(
        method,
        f"{p.admin_url}/admin/v1{path}",
        headers={"authorization": f"Bearer {ADMIN_TOKEN}"},
        timeout=60,
    )
    code = None
    if r.status_code >= 400:
        code = r.json()["error"]["code"]
    return r.status_code, code, time.monotonic() - t0


def readyz(url: str) -> dict[str, Any]:
    r = httpx.get(f"{url}/readyz", timeout=5)
    body: dict[str, Any] = r.json()
    body["_status"] = r.status_code
    return body


def stale(url: str) -> bool:
    return bool(table(url)["stale"])


def fresh(url: str) -> bool:
    return not stale(url)


def answers(url: str, key: str, model: str, status: int) -> bool:
    return chat(url, key, model)[0] == status


def table(url: str) -> dict[str, object]:
    t = readyz(url)["routing_table"]
    assert isinstance(t, dict)
    return t


def snapshot_age(p: Platform, url: str) -> float:
    return metric_sum(p.internal(url), "loraplane_snapshot_age_seconds")


def chat(url: str, key: str, model: str, timeout: float = 60) -> tuple[int, float]:
    t0 = time.monotonic()
    r = httpx.post(
        f"{url}/v1/chat/completions",
        headers={"authorization": f"Bearer {key}"},
        json={"model": model, "messages": MSG, "max_tokens": 2},
        timeout=timeout,
    )
    return r.status_code, time.monotonic() - t0


def audited(p: Platform, action: str, adapter_id: str) -> list[dict[str, object]]:
    return p.admin.list_audit(action=action, subject_id=adapter_id)


def audit_buffered(p: Platform) -> float:
    """Router audit events waiting for the database, over both gateways."""
    return sum(metric_sum(p.internal(g), "loraplane_audit_events_buffered") for g in p.gateway_urls)


def audit_dropped(p: Platform) -> float:
    return sum(metric_sum(p.internal(g), "loraplane_audit_events_dropped_total") for g in p.gateway_urls)


def evictions(p: Platform) -> float:
    return sum(
        metric_sum(p.internal(g), "loraplane_adapter_unloads_total", reason="evict") for g in p.gateway_urls
    )


def check_outage(s: Setup, started: float) -> None:
    """What an operator sees while the database is unreachable: admin 503 within the bound,
    /readyz 200 with the stale warning and a growing age on both gateways."""
    p = s.p
    for method, path in (("GET", "/adapters"), ("POST", "/adapters/fa4/disable"), ("GET", "/audit")):
        status, code, took = admin_call(p, method, path)
        assert (status, code) == (503, "database_unavailable"), (method, path, status, code)
        assert took <= ADMIN_BOUND_S, f"{method} {path} took {took:.1f}s"
        print(f"outage: {method} {path} → 503 in {took:.2f}s")
    # a burst past the connection pool (10 + 20 overflow): the calls that find no connection
    # free within the bound get the same 503, not a 500 or a wait
    with ThreadPoolExecutor(BURST) as pool:
        burst = list(pool.map(lambda _: admin_call(p), range(BURST)))
    assert {(st, code) for st, code, _ in burst} == {(503, "database_unavailable")}, burst
    assert max(took for *_, took in burst) <= BURST_BOUND_S, sorted(took for *_, took in burst)
    print(f"outage: {BURST} concurrent admin calls → 503 in at most {max(t for *_, t in burst):.2f}s")
    for g in p.gateway_urls:
        wait_until(partial(stale, g), STALE_WITHIN_S, f"{g} marks its table stale")
    first = {g: (table(g), snapshot_age(p, g)) for g in p.gateway_urls}
    time.sleep(1.5)
    for g in p.gateway_urls:
        body = readyz(g)
        assert body["_status"] == 200 and body["ready"] is True, body
        assert "routing_snapshot_stale" in body["warnings"], body  # a code on the public port
        t = body["routing_table"]
        assert isinstance(t, dict) and t["stale"] is True, t
        assert readyz(p.internal(g))["routing_table"]["last_error"]  # the error text: internal port
        age = float(t["age_s"])  # type: ignore[arg-type]
        assert age > float(first[g][0]["age_s"]) >= 0, (first[g], t)  # type: ignore[arg-type]
        gauge = snapshot_age(p, g)
        assert gauge > first[g][1] and gauge >= time.monotonic() - started - 1.0, (g, first[g][1], gauge)


# --------------------------------------------------------------------------- scenarios


def test_engine_on_hung_postgres_fails_within_its_timeout_then_recovers() -> None:
    """``make_engine(timeout_s=...)`` on a hung server (SIGSTOP: its kernel keeps accepting and
    acknowledging, nothing answers): a pooled connection's ping and a new connection both give up
    within the bound with ``OperationalError``, and the same engine works again after SIGCONT."""
    with own_postgres() as pg:
        engine = make_engine(pg.url + "/postgres", timeout_s=DB_TIMEOUT_S)
        fresh = make_engine(pg.url + "/postgres", timeout_s=DB_TIMEOUT_S)
        try:
            with engine.connect() as c:  # one connection in the pool
                assert c.execute(sa.text("SELECT 1")).scalar() == 1
            pg.hang()
            try:
                for e in (engine, fresh):  # a pooled connection (ping, reconnect); no connection yet
                    t0 = time.monotonic()
                    with pytest.raises(OperationalError), e.connect() as c:
                        c.execute(sa.text("SELECT 1"))
                    took = time.monotonic() - t0
                    assert took <= ADMIN_BOUND_S, took
            finally:
                pg.unhang()
            with engine.connect() as c:
                assert c.execute(sa.text("SELECT 1")).scalar() == 1
        finally:
            engine.dispose()
            fresh.dispose()


def test_postgres_stopped_gateways_serve_admin_503_then_recovers(plat: Setup) -> None:
    s, p = plat, plat.p
    cold, switched = s.models[2], s.models[3]
    cold_id, switched_id = cold.split(":")[1], switched.split(":")[1]
    pids = [proc.pid for proc in p.procs]
    traffic = Traffic(p.gateway_urls, s.key, s.models[:2], workers=4, bound_s=BOUND_S)
    with traffic:
        time.sleep(2.0)
        t_down = time.monotonic()
        s.pg.stop()
        check_outage(s, t_down)
        # a cold load while the database is down: served, its audit event kept for later
        status, took = chat(p.gateway_urls[0], s.key, cold)
        assert status == 200 and took <= COLD_BOUND_S, (status, took)
        assert audit_buffered(p) >= 1
        time.sleep(1.0)
        t_up = time.monotonic()
        s.pg.start()
        back = wait_until(lambda: admin_call(p)[0] == 200, 30, "the admin API works again")
        # the router's adapter.loaded event of the cold load, buffered through the outage
        wait_until(lambda: audited(p, "adapter.loaded", cold_id), 30, "adapter.loaded written")
        wait_until(lambda: audit_buffered(p) == 0, 15, "every buffered audit event written")
        assert audit_dropped(p) == 0
        for g in p.gateway_urls:
            wait_until(partial(fresh, g), 15, f"{g} fresh again")
            assert snapshot_age(p, g) < 5.0
        # a kill switch made after the outage reaches both gateways
        assert [chat(g, s.key, switched)[0] for g in p.gateway_urls] == [200, 200]
        p.admin.disable_adapter(switched_id)
        for g in p.gateway_urls:
            wait_until(partial(answers, g, s.key, switched, 403), 10, f"{g} applies the kill switch")
        time.sleep(1.0)
    report = traffic.stop()
    report.assert_accounted(set(), min_sent=40)
    assert report.count("ok") == report.sent
    during = report.between(t_down, t_up)
    assert during.sent >= 10 and during.count("ok") == during.sent, during.summary()
    assert [proc.pid for proc in p.procs] == pids and all(proc.alive() for proc in p.procs)
    print(f"admin back {back:.1f}s after the restart; {report.summary()}")


def test_postgres_hung_admin_503_bounded_cold_eviction_bounded_then_recovers(small_pool: Setup) -> None:
    s, p = small_pool, small_pool.p
    warm, cold, switched = s.models[2], s.models[3], s.models[4]
    cold_id, switched_id = cold.split(":")[1], switched.split(":")[1]
    # every replica holds its one adapter: the cold load below must evict one
    assert chat(p.gateway_urls[0], s.key, warm)[0] == 200
    pids = [proc.pid for proc in p.procs]
    unloaded_before = len(p.admin.list_audit(action="adapter.unloaded"))
    traffic = Traffic(p.gateway_urls, s.key, s.models[:2], workers=3, bound_s=BOUND_S)
    with traffic:
        time.sleep(2.0)
        evicted_before = evictions(p)
        t_hang = time.monotonic()
        s.pg.hang()
        try:
            # a cold load that needs an eviction: never waits on the unload's audit write
            status, took = chat(p.gateway_urls[0], s.key, cold)
            assert status == 200 and took <= COLD_BOUND_S, (status, took)
            assert evictions(p) > evicted_before
            check_outage(s, t_hang)
            assert audit_buffered(p) >= 2  # the eviction's adapter.unloaded, the adapter.loaded
        finally:
            t_cont = time.monotonic()
            s.pg.unhang()
        back = wait_until(lambda: admin_call(p)[0] == 200, 30, "the admin API works again")
        wait_until(lambda: audited(p, "adapter.loaded", cold_id), 30, "adapter.loaded written")
        wait_until(lambda: audit_buffered(p) == 0, 15, "every buffered audit event written")
        assert len(p.admin.list_audit(action="adapter.unloaded")) > unloaded_before
        assert audit_dropped(p) == 0
        for g in p.gateway_urls:
            wait_until(partial(fresh, g), 15, f"{g} fresh again")
        assert [chat(g, s.key, switched)[0] for g in p.gateway_urls] == [200, 200]
        p.admin.disable_adapter(switched_id)
        for g in p.gateway_urls:
            wait_until(partial(answers, g, s.key, switched, 403), 10, f"{g} applies the kill switch")
        time.sleep(1.0)
    report = traffic.stop()
    report.assert_accounted(set(), min_sent=30)
    assert report.count("ok") == report.sent
    during = report.between(t_hang, t_cont)
    assert during.sent >= 10 and during.count("ok") == during.sent, during.summary()
    assert [proc.pid for proc in p.procs] == pids and all(proc.alive() for proc in p.procs)
    print(f"admin back {back:.1f}s after SIGCONT; cold load with eviction {took:.2f}s; {report.summary()}")


def test_gateway_sigterm_while_postgres_hung_writes_its_buffered_audit_events(one_replica: Setup) -> None:
    """A gateway stopped (SIGTERM) while its audit events wait for the database keeps trying to
    write them for up to its close timeout (5 s) before it exits: the database back within it,
    they are written, and the process exits 0."""
    s, p = one_replica, one_replica.p
    g0, g1 = p.gateway_urls
    leaving = p.procs[2]  # the process behind g1
    cold_id = s.models[2].split(":")[1]
    traffic = Traffic(p.gateway_urls, s.key, s.models[:2], workers=3, bound_s=BOUND_S)
    with traffic:
        time.sleep(1.5)
        s.pg.hang()
        try:
            assert chat(g1, s.key, s.models[2])[0] == 200  # its adapter.loaded waits in g1's buffer
            assert metric_sum(p.internal(g1), "loraplane_audit_events_buffered") >= 1
            traffic.use([g0])
            time.sleep(0.5)
            t_term = time.monotonic()
            leaving.signal(signal.SIGTERM)
            # past the drain and the shutdown of its servers, into the 5 s the buffer gets at exit
            time.sleep(3.0)
        finally:
            s.pg.unhang()
        rc = leaving.wait(30)
        took = time.monotonic() - t_term
        wait_until(lambda: admin_call(p)[0] == 200, 30, "the admin API works again")
        wait_until(lambda: audited(p, "adapter.loaded", cold_id), 15, "the stopped gateway's event written")
    report = traffic.stop()
    assert rc == 0 and took < 20, (rc, took, leaving.log_tail())
    print(f"the gateway exited {took:.1f}s after SIGTERM")
    report.assert_accounted(set(), min_sent=20)
    assert report.count("ok") == report.sent
