"""Redis stopped and restarted under steady mixed traffic (SPEC §7, §18), on a Redis server of the
test's own: registry, two gateway processes, three simulator replicas, PostgreSQL and S3.

- ``LORAPLANE_RATELIMIT_ON_ERROR=closed``: while Redis is down every request gets 503
  ``rate_limiter_unavailable`` and ``/readyz`` answers 503 with the reason; Redis started again
  (same port, empty) → every gateway serves again without a restart, within a bound, and no
  request fails on a stale pooled connection afterwards.
- ``open``: while Redis is down requests keep succeeding without limits, a cold load still works
  (the load lease falls back to in-process singleflight, logged) and its audit event is written;
  after the restart the limits hold again (a tenant with a tiny rpm gets 429).

The same two modes with Redis **hung** (SIGSTOP to its processes: connections stay open and
nothing answers, issue 24.10), with ``LORAPLANE_REDIS_SOCKET_TIMEOUT_S`` and
``LORAPLANE_REDIS_CONNECT_TIMEOUT_S`` set: every request is answered within a bound those
timeouts imply (``closed``: 503 ``rate_limiter_unavailable``; ``open``: served, cold loads
included), and after SIGCONT every gateway serves with its limits again without a restart.

Every request is counted: sent = succeeded + failed with a designed error; no 500, no hang, no
truncated stream.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterator

import httpx
import pytest

from kit import localservices as ls
from kit.redis_factory import make_redis
from tests.gateway.gw_platform import Platform, run_platform

from .harness import MSG, OwnService, Report, Traffic, own_redis, seed, wait_served, wait_until

pytestmark = [pytest.mark.faults, pytest.mark.xdist_group("faults-redis")]

BOUND_S = 20.0
# open mode: once Redis accepts connections again, every gateway's limiter is healthy within this
RECOVER_S = 5.0
SIM_ARGS = ("--load-fixed-s", "0.05", "--decode-base-s", "0.02")
UNREACHABLE = "ratelimit_store_unreachable"  # the public /readyz reason code


# A hung Redis (SIGSTOP: connections stay open, nothing answers; issue 24.10): each command
# gives up after the socket timeout, a new connection after the connect timeout, a rate-limit
# round trip after LORAPLANE_REDIS_TIMEOUT_S.
SOCKET_TIMEOUT_S = 0.5
CONNECT_TIMEOUT_S = 0.5
LIMITER_TIMEOUT_S = 1.0
# The most a request may take while Redis hangs: its limiter round trip, a cluster-state call
# (mark, claim) and the request itself on a busy shared test machine.
HUNG_BOUND_S = LIMITER_TIMEOUT_S + 2 * SOCKET_TIMEOUT_S + 3.0
HUNG_ENV = {
    "LORAPLANE_REDIS_SOCKET_TIMEOUT_S": str(SOCKET_TIMEOUT_S),
    "LORAPLANE_REDIS_CONNECT_TIMEOUT_S": str(CONNECT_TIMEOUT_S),
}


@contextlib.contextmanager
def platform_on_own_redis(
    s3: ls.S3Server, mode: str, env: dict[str, str] | None = None
) -> Iterator[tuple[Platform, OwnService]]:
    with (
        own_redis() as rds,
        run_platform(
            s3,
            rds.url,
            gateways=2,
            sims=3,
            sim_args=SIM_ARGS,
            env={
                "LORAPLANE_RATELIMIT_ON_ERROR": mode,
                "LORAPLANE_REDIS_TIMEOUT_S": str(LIMITER_TIMEOUT_S),
                **(env or {}),
            },
        ) as p,
    ):
        yield p, rds


def readyz(url: str) -> httpx.Response:
    return httpx.get(f"{url}/readyz", timeout=5)


def chat(url: str, key: str, model: str, timeout: float = 30) -> httpx.Response:
    return httpx.post(
        f"{url}/v1/chat/completions",
        headers={"authorization": f"Bearer {key}"},
        json={"model": model, "messages": MSG, "max_tokens": 2},
        timeout=timeout,
    )


def log_text(p: Platform, i: int) -> str:
    return p.procs[i].log_path.read_text(errors="replace")


def assert_one_outage_logged(p: Platform) -> None:
    """Each gateway logged the outage once each way, for its limiter and its cluster state (loads
    singleflight within the process meanwhile): no flapping on stale connections after it."""
    lines = (
        "rate-limit store unreachable; applying ratelimit_on_error",
        "rate-limit store reachable again",
        "redis unreachable: cluster state is per process until it is back "
        "(loads are singleflight within this process only)",
        "redis reachable again: cluster state shared again",
    )
    for i in (1, 2):

        def logged(i: int = i) -> bool:
            return all(ln in log_text(p, i) for ln in lines)

        # the cluster state rejoins at its next heartbeat (slower than requests on a loaded machine)
        wait_until(logged, 15, f"gateway {i} logged the recovery")
        text = log_text(p, i)
        for line in lines:
            assert text.count(line) == 1, (line, text[-3000:])


def readyz_for(p: Platform, seconds: float) -> list[tuple[int, bool, list[str]]]:
    """Every gateway's /readyz, polled for ``seconds``: (status, rate-limit store healthy, reasons)."""
    out = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        for g in p.gateway_urls:
            r = readyz(g)
            body = r.json()
            out.append((r.status_code, body["ratelimit"]["healthy"], body["reasons"]))
        time.sleep(0.1)
    return out


def serving(p: Platform, key: str, model: str) -> bool:
    """Every gateway ready, its rate-limit store healthy, and a request through it succeeds."""
    for g in p.gateway_urls:
        r = readyz(g)
        if r.status_code != 200 or not r.json()["ratelimit"]["healthy"]:
            return False
        if chat(g, key, model).status_code != 200:
            return False
    return True


def test_redis_down_closed_refuses_then_every_gateway_recovers_without_restart(
    s3_server: ls.S3Server,
) -> None:
    with platform_on_own_redis(s3_server, "closed") as (p, rds):
        models = seed(p, adapters=4)
        key = p.keys["acme"]
        wait_served(p, key, models)
        traffic = Traffic(p.gateway_urls, key, models, workers=4, bound_s=BOUND_S, max_tokens=12)
        with traffic:
            time.sleep(2.0)
            t_stop = time.monotonic()
            rds.stop()
            t_down = time.monotonic()  # Redis has exited

            def refusing() -> bool:
                rs = [readyz(g) for g in p.gateway_urls]
                return all(r.status_code == 503 and UNREACHABLE in r.json()["reasons"] for r in rs)

            wait_until(refusing, 10, "every gateway's /readyz 503 with the reason")
            time.sleep(3.0)
            t_start = time.monotonic()
            rds.start()
            t_up = time.monotonic()  # Redis accepts connections again (empty)
            # every /readyz answered from now on is 200: no stale pooled connection fails it
            answers = readyz_for(p, 6.0)
        report = traffic.stop()
        print(f"redis down after {t_down - t_stop:.2f}s, accepting after {t_up - t_start:.2f}s; {report!r}")
        report.assert_accounted({"rate_limiter_unavailable"}, min_sent=40)
        calm = report.ended_before(t_stop)
        assert calm.sent >= 5 and calm.count("ok") == calm.sent, calm.summary()
        down = report.between(t_down, t_start - 1.0)  # admitted while Redis was down
        assert down.sent >= 5, down.summary()
        assert {o.code for o in down.outcomes} == {"rate_limiter_unavailable"}, down.summary()
        assert all(o.status == 503 for o in down.outcomes)
        assert len(answers) >= 10 and all(a == (200, True, []) for a in answers), answers
        # every request sent once Redis accepts connections succeeds, on both gateways
        after = report.between(t_up)
        assert after.sent >= 20 and after.count("ok") == after.sent, after.summary()
        assert {o.gateway for o in after.outcomes} == set(p.gateway_urls)
        assert_one_outage_logged(p)


def test_redis_down_open_serves_unlimited_cold_loads_audited_and_limits_return(
    s3_server: ls.S3Server,
) -> None:
    with platform_on_own_redis(s3_server, "open") as (p, rds):
        models = seed(p, adapters=6)  # traffic on 4; two stay cold until Redis is down
        key = p.keys["acme"]
        p.admin.create_tenant("tiny", limits={"rpm": 2})
        p.admin.put_grant("tiny", "fa0")
        tiny = p.admin.issue_key("tiny")["key"]
        wait_served(p, key, models[:4])
        g0, g1 = p.gateway_urls
        statuses = [chat(g, tiny, models[0]).status_code for g in (g0, g1, g0)]
        assert statuses == [200, 200, 429], statuses  # the limit holds with Redis up
        traffic = Traffic(p.gateway_urls, key, models[:4], workers=4, bound_s=BOUND_S, max_tokens=12)
        with traffic:
            time.sleep(2.0)
            t_stop = time.monotonic()
            rds.stop()

            def unlimited() -> bool:
                rs = [readyz(g) for g in p.gateway_urls]
                return all(r.status_code == 200 and not r.json()["ratelimit"]["healthy"] for r in rs)

            wait_until(unlimited, 10, "every gateway ready with the rate-limit store unhealthy")
            body = readyz(g0).json()
            assert UNREACHABLE in body["reasons"] and body["ratelimit"]["on_error"] == "open", body
            detail = readyz(p.internal(g0)).json()  # the words are on the internal port
            assert any("admitting without limits" in m for m in detail["messages"]), detail
            # limits are not enforced: the tiny tenant gets through, on both gateways
            assert [chat(g, tiny, models[0]).status_code for g in (g0, g1, g0, g1)] == [200] * 4
            # cold loads still work (in-process singleflight), one through each gateway
            cold = [chat(g0, key, models[4]).status_code, chat(g1, key, models[5]).status_code]
            assert cold == [200, 200]
            time.sleep(1.0)
            t_start = time.monotonic()
            rds.start()
            took = wait_until(
                lambda: serving(p, key, models[0]), RECOVER_S, "every gateway's limiter healthy"
            )
            t_rec = time.monotonic()
            time.sleep(3.0)
        report = traffic.stop()
        print(f"gateways serving with limits {took:.2f}s after Redis accepted; {report!r}")
        report.assert_accounted(set(), min_sent=40)  # open: nothing is refused
        assert report.between(t_stop, t_start).sent >= 5
        assert report.between(t_rec).count("ok") == report.between(t_rec).sent
        # each gateway said so: limits off, loads singleflight within the process; and back
        assert_one_outage_logged(p)

        # the cold loads' audit events were written (router audit is buffered: poll)
        def audited() -> bool:
            loaded = {e["subject_id"] for e in p.admin.list_audit(action="adapter.loaded")}
            return {"fa4", "fa5"} <= loaded

        wait_until(audited, 15, "the cold loads' adapter.loaded audit events")
        # limits hold again after recovery (Redis came back empty: the bucket starts full)
        statuses = [chat(g, tiny, models[0]).status_code for g in (g0, g1, g0, g1)]
        assert statuses[:2] == [200, 200] and 429 in statuses[2:], statuses


def test_pooled_connections_survive_a_redis_restart() -> None:
    """Finding 4's cause: after a restart every pooled connection is stale ("Connection closed by
    server"); each command is sent again on a fresh connection instead of failing."""

    async def main(rds: OwnService) -> list[object]:
        r = make_redis(rds.url, max_connections=8, timeout=2)
        try:
            await asyncio.gather(*[r.ping() for _ in range(5)])  # five pooled connections
            rds.stop()
            rds.start()
            return list(await asyncio.gather(*[r.ping() for _ in range(5)], return_exceptions=True))
        finally:
            await r.aclose()

    with own_redis() as rds:
        assert asyncio.run(main(rds)) == [True] * 5


# --------------------------------------------------------------------------- Redis hung (SIGSTOP)


def assert_bounded(report: Report, what: str) -> None:
    slowest = max((o.seconds for o in report.outcomes), default=0.0)
    assert slowest <= HUNG_BOUND_S, f"{what}: slowest {slowest:.2f}s > {HUNG_BOUND_S}s; {report.summary()}"


def test_redis_hung_closed_refuses_within_the_timeouts_then_recovers(s3_server: ls.S3Server) -> None:
    with platform_on_own_redis(s3_server, "closed", HUNG_ENV) as (p, rds):
        models = seed(p, adapters=4)
        key = p.keys["acme"]
        wait_served(p, key, models)
        traffic = Traffic(p.gateway_urls, key, models, workers=4, bound_s=BOUND_S, max_tokens=12)
        with traffic:
            time.sleep(2.0)
            t_hang = time.monotonic()
            rds.hang()
            try:

                def refusing() -> bool:
                    rs = [readyz(g) for g in p.gateway_urls]
                    return all(r.status_code == 503 and UNREACHABLE in r.json()["reasons"] for r in rs)

                wait_until(refusing, 10, "every gateway's /readyz 503 with the reason")
                t_refusing = time.monotonic()
                time.sleep(4.0)
            finally:
                t_cont = time.monotonic()
                rds.unhang()
            took = wait_until(lambda: serving(p, key, models[0]), BOUND_S, "every gateway serving again")
            t_back = time.monotonic()
            time.sleep(3.0)
        report = traffic.stop()
        print(f"hung: refusing after {t_refusing - t_hang:.2f}s, serving {took:.2f}s after; {report!r}")
        report.assert_accounted({"rate_limiter_unavailable"}, min_sent=40)
        hung = report.between(t_hang, t_cont)
        assert hung.sent >= 8, hung.summary()
        assert_bounded(hung, "while Redis hung")
        refused = report.between(t_refusing, t_cont - LIMITER_TIMEOUT_S - 0.5)  # ended before SIGCONT
        assert refused.sent >= 5 and {o.code for o in refused.outcomes} == {"rate_limiter_unavailable"}
        assert all(o.status == 503 for o in refused.outcomes), refused.summary()
        assert took <= RECOVER_S + 2 * SOCKET_TIMEOUT_S + 5.0, took
        after = report.between(t_back)
        assert after.sent >= 10 and after.count("ok") == after.sent, after.summary()


def test_redis_hung_open_serves_within_the_timeouts_cold_loads_included_then_limits_return(
    s3_server: ls.S3Server,
) -> None:
    with platform_on_own_redis(s3_server, "open", HUNG_ENV) as (p, rds):
        models = seed(p, adapters=6)  # traffic on 4; two stay cold until Redis hangs
        key = p.keys["acme"]
        p.admin.create_tenant("tiny", limits={"rpm": 2})
        p.admin.put_grant("tiny", "fa0")
        tiny = p.admin.issue_key("tiny")["key"]
        wait_served(p, key, models[:4])
        g0, g1 = p.gateway_urls
        traffic = Traffic(p.gateway_urls, key, models[:4], workers=4, bound_s=BOUND_S, max_tokens=12)
        with traffic:
            time.sleep(2.0)
            t_hang = time.monotonic()
            rds.hang()
            try:
                time.sleep(1.0)
                # cold loads still work (in-process singleflight), one through each gateway, in bound
                cold: list[tuple[int, float]] = []
                for g, m in ((g0, models[4]), (g1, models[5])):
                    t0 = time.monotonic()
                    cold.append((chat(g, key, m).status_code, time.monotonic() - t0))
                assert [c[0] for c in cold] == [200, 200], cold
                assert all(c[1] <= HUNG_BOUND_S for c in cold), cold
                time.sleep(4.0)
            finally:
                t_cont = time.monotonic()
                rds.unhang()
            took = wait_until(lambda: serving(p, key, models[0]), BOUND_S, "every gateway's limiter healthy")
            t_back = time.monotonic()
            time.sleep(3.0)
        report = traffic.stop()
        print(f"hung open: limiter healthy {took:.2f}s after SIGCONT; {report!r}")
        report.assert_accounted(set(), min_sent=40)  # open: nothing is refused
        hung = report.between(t_hang, t_cont)
        assert hung.sent >= 8 and hung.count("ok") == hung.sent, hung.summary()
        assert_bounded(hung, "while Redis hung")
        assert took <= RECOVER_S + 2 * SOCKET_TIMEOUT_S + 5.0, took
        after = report.between(t_back)
        assert after.sent >= 10 and after.count("ok") == after.sent, after.summary()
        # the limits hold again after SIGCONT (Redis kept its data: the tiny bucket may be spent)
        statuses = [chat(g, tiny, models[0]).status_code for g in (g0, g1, g0, g1)]
        assert 429 in statuses, statuses
