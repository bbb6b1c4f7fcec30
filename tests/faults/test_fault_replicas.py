"""Replica faults (SPEC §18) under steady mixed traffic through two gateway processes: registry,
two gateways, three simulator replicas, PostgreSQL, Redis and the S3 server, all real processes.

- a replica SIGKILLed while streams run on it: every stream ends with ``[DONE]`` (an error event
  first for the cut ones), new requests fail over, and once it is back it serves again;
- a replica hung (SIGSTOP) then resumed (SIGCONT): every request is bounded by the first-byte and
  idle timeouts (no hang), the replica leaves rotation, and returns after SIGCONT.

Every request sent is counted: sent = succeeded + failed with a designed error; no truncated
stream, no hang, no 500.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator

import httpx
import pytest

from kit import localservices as ls
from tests.gateway.gw_platform import Platform, run_platform

from .harness import Traffic, metric_sum, seed, wait_served

pytestmark = [pytest.mark.faults, pytest.mark.xdist_group("faults-replicas")]

TTFB_S = 3.0
IDLE_S = 3.0
# no request may take longer: TTFB/idle bounds, one retry elsewhere, margin for a busy CI machine
BOUND_S = 20.0
REPLICA_DESIGNED = {"upstream_error", "upstream_timeout", "no_capacity", "adapter_load_failed"}


@pytest.fixture
def plat(s3_server: ls.S3Server, redis_url: str) -> Iterator[tuple[Platform, list[str]]]:
    with run_platform(
        s3_server,
        redis_url,
        gateways=2,
        sims=3,
        sim_args=("--enable-fault-control", "--load-fixed-s", "0.05", "--decode-base-s", "0.03"),
        env={
            "LORAPLANE_UPSTREAM_TTFB_TIMEOUT_S": str(TTFB_S),
            "LORAPLANE_UPSTREAM_IDLE_TIMEOUT_S": str(IDLE_S),
            "LORAPLANE_REQUEST_TIMEOUT_S": "8",
            "LORAPLANE_OUTLIER_COOLOFF_S": "2",
        },
    ) as p:
        models = seed(p, adapters=7)  # traffic uses 4; the other 3 are cold, for the returning replica
        wait_served(p, p.keys["acme"], models[:4])
        yield p, models


def served_by(p: Platform, sim: int) -> int:
    """Requests the simulator has finished (its own vLLM metric)."""
    text = httpx.get(f"{p.sim_urls[sim]}/metrics", timeout=5).text
    total = 0.0
    for line in text.splitlines():
        if line.startswith("vllm:request_success_total"):
            total += float(line.rsplit(" ", 1)[1])
    return int(total)


def healthy(p: Platform) -> list[int]:
    return [httpx.get(f"{g}/readyz", timeout=5).json()["replicas_healthy"] for g in p.gateway_urls]


def cold(p: Platform, model: str) -> int:
    r = httpx.post(
        f"{p.gateway_urls[0]}/v1/chat/completions",
        headers={"authorization": f"Bearer {p.keys['acme']}"},
        json={"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
        timeout=30,
    )
    return r.status_code


def wait_until(pred: object, timeout: float, what: str) -> float:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if pred():  # type: ignore[operator]
            return time.monotonic() - t0
        time.sleep(0.2)
    raise AssertionError(f"{what}: not within {timeout} s")


def test_replica_sigkill_mid_stream_every_request_accounted(plat: tuple[Platform, list[str]]) -> None:
    p, models = plat
    victim = p.sims[0]
    traffic = Traffic(p.gateway_urls, p.keys["acme"], models[:4], workers=6, bound_s=BOUND_S, max_tokens=24)
    with traffic:
        time.sleep(3.0)
        t_kill = time.monotonic()
        victim.kill()
        time.sleep(6.0)
        t_restart = time.monotonic()
        victim.start()
        victim.wait_ready(30)
        wait_until(lambda: min(healthy(p)) == 3, 20, "the restarted replica back in rotation everywhere")
        before = served_by(p, 0)
        time.sleep(2.0)
        cold_answers = [cold(p, m) for m in models[4:]]  # cold loads prefer the replica with free slots
        time.sleep(2.0)
    report = traffic.stop()
    report.assert_accounted(REPLICA_DESIGNED, min_sent=60)
    during = report.between(t_kill, t_kill + 0.5)
    after = report.between(t_kill + 3.0, t_restart)
    calm = report.ended_before(t_kill)
    assert calm.count("ok") == calm.sent >= 5, calm.summary()
    # streams the kill cut ended with an error event and [DONE]; none was cut silently
    assert report.between(0, t_kill).count("stream_error") >= 1, report.summary()
    # finding 3: a stream cut mid-way is an error in the gateways' metrics (and access log), not a 200
    cut = report.count("stream_error")
    errors = sum(
        metric_sum(p.internal(g), "loraplane_gateway_errors_total", error="upstream_error")
        for g in p.gateway_urls
    )
    assert errors >= cut, (errors, report.summary())
    # requests after the failover settled succeed on the two replicas left
    assert after.count("ok") >= 0.95 * after.sent and after.sent >= 20, after.summary()
    assert during.sent >= 1
    # the restarted replica serves again (its residency re-learned; adapters loaded on demand)
    assert cold_answers == [200, 200, 200]
    assert served_by(p, 0) > before, "the restarted replica got no requests"


def test_replica_sigstop_is_bounded_and_it_returns_after_sigcont(plat: tuple[Platform, list[str]]) -> None:
    p, models = plat
    hung = p.sims[1]
    assert hung.managed is not None
    traffic = Traffic(p.gateway_urls, p.keys["acme"], models[:4], workers=6, bound_s=BOUND_S, max_tokens=24)
    with traffic:
        time.sleep(3.0)
        t_stop = time.monotonic()
        hung.managed.signal(signal.SIGSTOP)
        try:
            wait_until(lambda: max(healthy(p)) == 2, 15, "the hung replica out of rotation")
            # at least 5 s of traffic after the requests caught by the hang have timed out (found
            # out of rotation quickly, the window checked below was ~1 s: 7 requests, a CI failure)
            time.sleep(max(5.0, t_stop + TTFB_S + IDLE_S + 2.0 + 5.0 - time.monotonic()))
        finally:
            t_cont = time.monotonic()
            hung.managed.signal(signal.SIGCONT)
        wait_until(lambda: min(healthy(p)) == 3, 30, "the resumed replica back in rotation")
        before = served_by(p, 1)
        time.sleep(2.0)
        cold_answers = [cold(p, m) for m in models[4:]]
        time.sleep(2.0)
    report = traffic.stop()
    report.assert_accounted(REPLICA_DESIGNED, min_sent=60)
    hang_window = report.between(t_stop, t_cont)
    # every request during the hang finished within its bound: TTFB / idle timeout (+ one retry)
    assert max(o.seconds for o in hang_window.outcomes) <= TTFB_S + IDLE_S + 6.0, hang_window.summary()
    # once out of rotation, requests succeed on the two others
    settled = report.between(t_stop + TTFB_S + IDLE_S + 2.0, t_cont)
    assert settled.sent >= 10 and settled.count("ok") >= 0.9 * settled.sent, settled.summary()
    assert cold_answers == [200, 200, 200]
    assert served_by(p, 1) > before, "the resumed replica got no requests"
