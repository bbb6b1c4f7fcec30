"""Limits of every level through the real gateways (SPEC §15, §17): PostgreSQL, Redis, S3,
simulator replicas, the admin API and two `loraplane serve --role gateway` processes sharing
Redis with a short slot lease (``LORAPLANE_LEASE_S=2``).

Adapter limits are shared by every tenant, owner limits by every adapter of the owner; a 429
says in ``details`` which level and which limit. A live long stream keeps its concurrency slot
past the lease; a gateway SIGKILLed while holding a tenant's slots frees them within the lease.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from kit import localservices as ls

from .gw_platform import Platform, run_platform

pytestmark = [pytest.mark.cluster, pytest.mark.xdist_group("gw-limit-levels")]

LEASE_S = 2.0
MSG: Any = [{"role": "user", "content": "Say hello"}]


@pytest.fixture(scope="module")
def plat(s3_server: ls.S3Server, redis_url: str) -> Iterator[Platform]:
    with run_platform(
        s3_server,
        redis_url,
        sim_args=("--zero-latency", "--enable-fault-control"),
        env={"LORAPLANE_LEASE_S": str(LEASE_S)},
    ) as p:
        a = p.admin
        for ad in ("shared", "other", "conc", "b1", "b2"):
            p.adapter(ad)
        for ad in ("b1", "b2"):
            a.update_adapter(ad, owner="Payments EU")
        tenants: list[tuple[str, dict[str, int | None] | None]] = [
            ("acme", None),
            ("zeta", None),
            ("solo", {"max_concurrency": 1}),
            ("pair", {"max_concurrency": 2}),
        ]
        for t, limits in tenants:
            a.create_tenant(t, limits=limits)
            for ad in ("shared", "other", "conc", "b1", "b2"):
                a.put_grant(t, ad)
            p.keys[t] = a.issue_key(t)["key"]
        _converge(p)
        yield p


def _revisions(p: Platform) -> list[int]:
    return [int(httpx.get(f"{u}/readyz").json()["routing_table"]["revision"]) for u in p.gateway_urls]


def _converge(p: Platform, timeout: float = 10.0) -> None:
    """Until both gateways serve the same revision, twice in a row (the feed delivered the setup)."""
    deadline = time.monotonic() + timeout
    last: list[int] = []
    while time.monotonic() < deadline:
        revs = _revisions(p)
        if len(set(revs)) == 1 and revs == last:
            return
        last = revs
        time.sleep(0.3)
    raise AssertionError(f"gateways did not converge: {last}")


def _changed(p: Platform, change: Any) -> None:
    """Make a registry change and wait until both gateways have it."""
    before = _revisions(p)
    change()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if all(now > was for now, was in zip(_revisions(p), before, strict=True)):
            return
        time.sleep(0.05)
    raise AssertionError("the change never reached both gateways")


def _chat(p: Platform, tenant: str, adapter: str, gw: int = 0, **kw: Any) -> httpx.Response:
    return httpx.post(
        f"{p.gateway_urls[gw]}/v1/chat/completions",
        headers={"authorization": f"Bearer {p.keys[tenant]}"},
        json={"model": f"demo-base:{adapter}", "messages": MSG, "max_tokens": 2, **kw},
        timeout=30,
    )


def _limit_error(r: httpx.Response) -> dict[str, Any]:
    assert r.status_code == 429, r.text
    err: dict[str, Any] = r.json()["error"]
    assert err["code"] == "rate_limit_exceeded" and err["type"] == "rate_limit_error"
    assert int(r.headers["retry-after"]) >= 1
    return err


@contextlib.contextmanager
def _stalled(p: Platform, seconds: float) -> Iterator[None]:
    """Replicas hold every answer after its first token (long streams), then answer normally."""
    for u in p.sim_urls:
        httpx.post(f"{u}/_sim/faults", json={"stall_s": seconds, "stall_after_tokens": 1}).raise_for_status()
    try:
        yield
    finally:
        for u in p.sim_urls:
            httpx.post(f"{u}/_sim/faults", json={"stall_s": 0}).raise_for_status()


@contextlib.contextmanager
def _open_stream(p: Platform, tenant: str, adapter: str, gw: int) -> Iterator[Iterator[bytes]]:
    """A streaming request held open: admitted (200, first chunk read) until the block ends;
    yields the rest of its chunks."""
    with (
        httpx.Client(timeout=60) as c,
        c.stream(
            "POST",
            f"{p.gateway_urls[gw]}/v1/chat/completions",
            headers={"authorization": f"Bearer {p.keys[tenant]}"},
            json={"model": f"demo-base:{adapter}", "messages": MSG, "max_tokens": 50, "stream": True},
        ) as r,
    ):
        assert r.status_code == 200, r.read()
        chunks = r.iter_raw()
        next(chunks)
        yield chunks


def test_adapter_rpm_is_shared_by_every_tenant_across_gateways(plat: Platform) -> None:
    _changed(plat, lambda: plat.admin.set_adapter_limits("shared", {"rpm": 3}))
    assert _chat(plat, "acme", "shared", gw=0).status_code == 200
    assert _chat(plat, "acme", "shared", gw=1).status_code == 200
    assert _chat(plat, "zeta", "shared", gw=1).status_code == 200
    r = _chat(plat, "zeta", "shared", gw=0)
    err = _limit_error(r)
    assert err["details"]["level"] == "adapter" and err["details"]["limit"] == "rpm"
    assert err["details"]["value"] == 3 and 0 < err["details"]["retry_after_s"] <= 20.5  # 60/3 s a request
    assert "adapter, shared by all tenants (3 rpm)" in err["message"]
    assert (
        r.headers["x-ratelimit-limit-requests"] == "3" and r.headers["x-ratelimit-remaining-requests"] == "0"
    )
    assert _chat(plat, "zeta", "other", gw=0).status_code == 200  # another adapter is not limited
    _changed(plat, lambda: plat.admin.set_adapter_limits("shared", None))
    assert _chat(plat, "zeta", "shared", gw=0).status_code == 200


def test_owner_rpm_spans_the_owners_adapters(plat: Platform) -> None:
    _changed(plat, lambda: plat.admin.put_owner_limits("Payments EU", {"rpm": 2}))
    assert _chat(plat, "acme", "b1", gw=0).status_code == 200
    assert _chat(plat, "zeta", "b2", gw=1).status_code == 200
    err = _limit_error(_chat(plat, "acme", "b2", gw=0))
    assert (err["details"]["level"], err["details"]["limit"], err["details"]["value"]) == ("owner", "rpm", 2)
    assert "owner" in err["message"] and "Payments EU" not in err["message"]  # no owner name leaks
    assert _chat(plat, "acme", "shared", gw=0).status_code == 200
    _changed(plat, lambda: plat.admin.put_owner_limits("Payments EU", {}))
    assert _chat(plat, "acme", "b2", gw=0).status_code == 200


def test_adapter_concurrency_across_gateways(plat: Platform) -> None:
    _changed(plat, lambda: plat.admin.set_adapter_limits("conc", {"max_concurrency": 1}))
    with _stalled(plat, 30), _open_stream(plat, "acme", "conc", gw=0):
        err = _limit_error(_chat(plat, "zeta", "conc", gw=1))
        assert err["details"] == {
            "level": "adapter",
            "limit": "max_concurrency",
            "value": 1,
            "retry_after_s": 1.0,
        }
    deadline = time.monotonic() + 5  # the slot is released when the stream ends
    while (r := _chat(plat, "zeta", "conc", gw=1)).status_code == 429 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert r.status_code == 200, r.text


def test_live_long_stream_keeps_its_slot_past_the_lease(plat: Platform) -> None:
    with _stalled(plat, 30), _open_stream(plat, "solo", "other", gw=0):
        t0 = time.monotonic()
        n = 0
        while time.monotonic() - t0 < 2.5 * LEASE_S:
            err = _limit_error(_chat(plat, "solo", "other", gw=1))
            assert err["details"]["level"] == "tenant" and err["details"]["limit"] == "max_concurrency"
            n += 1
            time.sleep(0.25)
        assert n >= 5
    deadline = time.monotonic() + 5
    while (r := _chat(plat, "solo", "other", gw=1)).status_code == 429 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert r.status_code == 200, r.text


def test_sigkilled_gateway_frees_its_tenants_slots_within_the_lease(plat: Platform) -> None:
    """Last in the module: gateway 1 is killed."""
    with _stalled(plat, 60), contextlib.ExitStack() as streams:
        for _ in range(2):
            streams.enter_context(_open_stream(plat, "pair", "other", gw=1))
        time.sleep(LEASE_S / 2)  # past a renewal by the live gateway
        r = _chat(plat, "pair", "other", gw=0)
        err = _limit_error(r)
        assert err["details"]["level"] == "tenant" and err["details"]["value"] == 2
        assert r.headers["retry-after"] == "1"  # held by live requests: they free it when they end
        plat.procs[2].kill()  # gateway 1, SIGKILL: no goodbye, its streams die with it
        killed = time.monotonic()
    tries: list[tuple[float, float, httpx.Response]] = []  # (sent, answered, answer)
    while time.monotonic() - killed < LEASE_S + 3:
        sent = time.monotonic()
        r = _chat(plat, "pair", "other", gw=0)
        tries.append((sent, time.monotonic(), r))
        if r.status_code == 200:
            break
        time.sleep(0.1)
    assert tries[-1][2].status_code == 200, [a.status_code for _, _, a in tries]
    freed_after, freed_by = (tries[-2][0] if len(tries) > 1 else killed), tries[-1][1]
    assert freed_by - killed <= LEASE_S + 1.5
    for sent, answered, a in tries[:-1]:
        ra = _limit_error(a)["details"]["retry_after_s"]
        if ra != 1:  # a holder that stopped renewing: when its slot frees
            assert sent + ra <= freed_by + 0.3 and answered + ra >= freed_after - 0.3, (
                sent - killed, ra, freed_after - killed, freed_by - killed,
            )  # fmt: skip
