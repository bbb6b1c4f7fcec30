"""Gateway processes that die or are told to stop (SPEC §17, §18), under steady traffic: registry,
two gateway processes, three simulator replicas, PostgreSQL, Redis (the test's own) and S3.

- a gateway SIGKILLed while it holds a tenant's concurrency slots (finding 8): the slots expire
  within ``LORAPLANE_LEASE_S`` of its last renewal and the tenant uses both through the other
  gateway; every 429 meanwhile says when to retry truthfully — 1 s while the dead holder still
  looks alive (renewed within the last two thirds of the lease: it cannot be told from a live
  one), then the time until its slot expires;
- a gateway SIGTERMed while streams run through it: its streams finish, its new requests get 503
  ``draining`` until it exits 0 within ``LORAPLANE_DRAIN_S``; the other gateway serves on.

Every request of the steady traffic is counted: sent = succeeded + failed with a designed error;
no truncated stream, no hang, no 500, no refused connection.
"""

from __future__ import annotations

import math
import signal
import threading
import time
from collections.abc import Iterator

import httpx
import pytest
import redis

from kit import localservices as ls
from tests.gateway.gw_platform import Platform, run_platform

from .harness import MSG, Outcome, OwnService, Traffic, own_redis, seed, wait_served, wait_until

pytestmark = [pytest.mark.faults, pytest.mark.xdist_group("faults-gateways")]

BOUND_S = 20.0
LEASE_S = 6.0
DRAIN_S = 15.0
# each decode step 50 ms: a stream of N tokens lasts about N / 20 s
SIM_ARGS = ("--load-fixed-s", "0.05", "--decode-base-s", "0.05")


@pytest.fixture
def plat(s3_server: ls.S3Server) -> Iterator[tuple[Platform, OwnService]]:
    with (
        own_redis() as rds,
        run_platform(
            s3_server,
            rds.url,
            gateways=2,
            sims=3,
            sim_args=SIM_ARGS,
            env={"LORAPLANE_LEASE_S": str(LEASE_S), "LORAPLANE_DRAIN_S": str(DRAIN_S)},
        ) as p,
    ):
        yield p, rds


class Stream:
    """One long streaming request in a thread: ``started`` once its first chunk arrived."""

    def __init__(self, url: str, key: str, model: str, max_tokens: int) -> None:
        self.started = threading.Event()
        self.status: int | None = None
        self.text = ""
        self.error: str | None = None
        body = {"model": model, "messages": MSG, "max_tokens": max_tokens, "stream": True}
        self._args = (url, key, body)
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        url, key, body = self._args
        try:
            with httpx.stream(
                "POST",
                f"{url}/v1/chat/completions",
                headers={"authorization": f"Bearer {key}"},
                json=body,
                timeout=60,
            ) as r:
                self.status = r.status_code
                for chunk in r.iter_text():
                    self.text += chunk
                    self.started.set()
        except httpx.HTTPError as e:
            self.error = repr(e)
        finally:
            self.started.set()

    def join(self, timeout: float) -> None:
        self._thread.join(timeout)
        assert not self._thread.is_alive(), "a stream outlived its timeout"


def chat(url: str, key: str, model: str) -> httpx.Response:
    return httpx.post(
        f"{url}/v1/chat/completions",
        headers={"authorization": f"Bearer {key}"},
        json={"model": model, "messages": MSG, "max_tokens": 2},
        timeout=30,
    )


def lease_expiries(rds: OwnService, tenant: str) -> list[float]:
    """The expiry of every lease on ``tenant``'s concurrency slots, as ``time.monotonic()`` values
    here (Redis scores them by its own clock)."""
    client = redis.Redis.from_url(rds.url)
    try:
        keys = list(client.scan_iter(match=f"*rl:t:{tenant}:conc"))
        assert len(keys) == 1, keys
        before = time.monotonic()
        now: tuple[int, int] = client.time()  # type: ignore[assignment]
        offset = now[0] + now[1] / 1e6 - (before + time.monotonic()) / 2
        held: list[tuple[bytes, float]] = client.zrange(keys[0], 0, -1, withscores=True)  # type: ignore[assignment]
        scores = [score for _, score in held]
    finally:
        client.close()
    return sorted(s - offset for s in scores)


def expected_retry_after(expiries: list[float], at: float) -> int:
    """What the admission script answers at ``at`` for slots held only by ``expiries``: 1 s while a
    holder looks alive (expires more than lease_s/3 from now), else the time until the first expiry."""
    if max(expiries) >= at + LEASE_S / 3:
        return 1
    return max(1, math.ceil(min(expiries) - at))


def test_gateway_sigkill_frees_its_concurrency_slots_within_the_lease(
    plat: tuple[Platform, OwnService],
) -> None:
    p, rds = plat
    (model,) = seed(p, adapters=1, tenant="solo", limits={"rpm": 1_000_000, "max_concurrency": 2})
    key = p.keys["solo"]
    wait_served(p, key, [model])
    a, b = p.gateway_urls
    # two long streams through gateway A take both slots
    streams = [Stream(a, key, model, max_tokens=1000) for _ in range(2)]
    for s in streams:
        assert s.started.wait(20) and s.status == 200, (s.status, s.error)
    refused = chat(b, key, model)
    assert refused.status_code == 429, refused.text
    assert refused.json()["error"]["details"]["limit"] == "max_concurrency"

    traffic = Traffic([b], key, [model], workers=2, bound_s=BOUND_S, max_tokens=4)
    with traffic:
        time.sleep(1.0)
        t_kill = time.monotonic()
        p.procs[1].kill()  # gateway A: SIGKILL, no goodbye
        expiries = lease_expiries(rds, "solo")
        assert len(expiries) == 2, expiries  # A's two leases, no longer renewed

        def served_after_kill() -> bool:
            return any(o.kind == "ok" and o.t0 > t_kill for o in traffic.report().outcomes)

        wait_until(served_after_kill, LEASE_S + 5, "the tenant served through B after the kill")
        time.sleep(2.0)
    report = traffic.stop()
    print(f"leases expire {[round(e - t_kill, 2) for e in expiries]} s after the kill; {report!r}")
    for s in streams:  # the streams through A died with it
        s.join(10)
        assert s.error is not None or not s.text.rstrip().endswith("[DONE]")
    report.assert_accounted({"rate_limit_exceeded"}, min_sent=10)
    # the leases expire within LORAPLANE_LEASE_S of the kill (A renewed them until it died)
    assert all(t_kill < e <= t_kill + LEASE_S + 0.5 for e in expiries), expiries
    t_free = min(expiries)
    oks = [o for o in report.outcomes if o.kind == "ok" and o.t0 > t_kill]
    first_ok = min(oks, key=lambda o: o.t1)
    assert first_ok.t1 >= t_free - 0.05, (first_ok, t_free)  # not admitted before a slot freed
    assert first_ok.t0 <= max(expiries) + 1.5, (first_ok, expiries)  # and promptly after
    settled = report.between(max(expiries) + 1.0)
    assert settled.sent >= 5 and settled.count("ok") == settled.sent, settled.summary()
    # every 429 said when to retry truthfully (checked where the answer's instant is unambiguous)
    rejected = [o for o in report.outcomes if o.kind == "designed"]
    assert rejected, report.summary()
    checked = 0
    for o in rejected:
        assert o.code == "rate_limit_exceeded" and o.retry_after is not None, o
        ra = int(o.retry_after)
        assert 1 <= ra <= math.ceil(LEASE_S), o
        lo, hi = expected_retry_after(expiries, o.t1), expected_retry_after(expiries, o.t0)
        if o.t0 > t_kill and lo == hi:
            assert ra == lo, (o, lo, [e - o.t0 for e in expiries])
            checked += 1
    assert checked >= 3, rejected
    # the time until the expiry was answered (not "1 s") while the dead holder was known dead
    assert any(int(o.retry_after or 0) >= 2 for o in rejected if o.t0 > t_kill), rejected
    # the tenant has exactly its two slots again through B: two streams in, a third request 429
    again = [Stream(b, key, model, max_tokens=200) for _ in range(2)]
    for s in again:
        assert s.started.wait(20) and s.status == 200, (s.status, s.error)
    third = chat(b, key, model)
    assert third.status_code == 429 and third.headers["retry-after"] == "1", third.text
    for s in again:
        s.join(30)
        assert s.text.rstrip().endswith("data: [DONE]") and s.error is None


def test_gateway_sigterm_under_traffic_drains_and_exits_0(plat: tuple[Platform, OwnService]) -> None:
    p, _ = plat
    models = seed(p, adapters=4)
    key = p.keys["acme"]
    wait_served(p, key, models)
    a, b = p.gateway_urls
    gateway_a = p.procs[1]
    # answers of 30 tokens (about 1.5 s): some are always in flight on A when it is told to stop
    traffic = Traffic(p.gateway_urls, key, models, workers=8, bound_s=BOUND_S, max_tokens=30)
    with traffic:
        time.sleep(3.0)
        # a long stream keeps A draining for ~5 s, so traffic moves to B before A exits (a request
        # sent to a gateway that has exited is refused: a load balancer would have dropped it)
        held = Stream(a, key, models[0], max_tokens=100)
        assert held.started.wait(20) and held.status == 200, (held.status, held.error)
        t_term = time.monotonic()
        gateway_a.signal(signal.SIGTERM)
        time.sleep(0.3)
        ready = httpx.get(f"{a}/readyz", timeout=5)
        time.sleep(2.5)  # A refuses new requests while the held stream goes on
        traffic.use([b])  # before A can exit: a connection refused by a gateway gone is not counted
        t_switch = time.monotonic()
        rc = gateway_a.wait(DRAIN_S + 10)
        t_exit = time.monotonic()
        time.sleep(4.0)
    report = traffic.stop()
    held.join(30)
    print(f"A exited {t_exit - t_term:.2f}s after SIGTERM with {rc}; {report!r}")
    assert held.text.rstrip().endswith("data: [DONE]") and held.error is None and '"error"' not in held.text
    assert t_exit > t_switch
    assert ready.status_code == 503 and ready.json()["draining"] is True, ready.text
    report.assert_accounted({"draining"}, min_sent=30)
    on_a = report.where(gateway=a)
    # the requests in flight on A at SIGTERM finished normally, streams included
    in_flight: list[Outcome] = [o for o in on_a.outcomes if o.t0 < t_term < o.t1]
    assert in_flight and all(o.kind == "ok" for o in in_flight), in_flight
    assert any(o.stream for o in in_flight)
    # new requests to A were refused with 503 draining (Retry-After), from just after the signal
    late = on_a.between(t_term + 0.3).outcomes
    assert late and all(o.status == 503 and o.code == "draining" for o in late), late
    assert all(o.retry_after == "1" for o in late)
    assert all(o.t0 < t_switch for o in on_a.outcomes)
    # A exited 0 once its last request was done, well within LORAPLANE_DRAIN_S
    assert rc == 0
    assert t_exit - t_term <= DRAIN_S, t_exit - t_term
    assert max(o.t1 for o in in_flight) <= t_exit
    # B served everything, before and after
    on_b = report.where(gateway=b)
    assert on_b.count("ok") == on_b.sent and report.between(t_switch).sent >= 8, on_b.summary()
