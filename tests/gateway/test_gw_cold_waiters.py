"""Requests waiting for a cold load, capped per tenant (``max_cold_waiters``) and per adapter
(SPEC §15): the gate itself, the gateway app with a fake router (the 503's shape, release on
every exit path, client disconnect included), and the real gateway process with simulator
replicas whose loads are slowed down (``/_sim/faults`` ``slow_load_s``)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import threading
import time
from collections.abc import Callable, Iterator, MutableMapping
from typing import Any

import httpx
import orjson
import pytest

from gateway.errors import GatewayError
from gateway.service import ColdLoadGate
from kit import localservices as ls
from registry.snapshot import Limits, TenantInfo, VersionInfo
from router.contract import NoCapacity

from .gw_platform import Platform, run_platform
from .test_gw_api_unit import Env

MSG: Any = [{"role": "user", "content": "hello"}]


def _version(adapter_id: str, version: str = "v1") -> VersionInfo:
    return VersionInfo(
        adapter_id=adapter_id, version=version, number=int(version[1:]), status="active", rank=8,
        lora_alpha=16.0, target_modules=("q_proj",), files=(), storage_uri="file:///x/",
        base_model="demo-base",
    )  # fmt: skip


def _tenant(tid: str, cap: int | None) -> TenantInfo:
    return TenantInfo(tid, tid, Limits(), False, {}, max_cold_waiters=cap)


# --------------------------------------------------------------------------- the gate


def test_tenant_cap_counts_cold_requests_over_all_its_adapters() -> None:
    resident = {_version("warm").lora_name}
    gate = ColdLoadGate(64, resident.__contains__)
    acme, zeta, free = _tenant("acme", 2), _tenant("zeta", 2), _tenant("free", None)
    with contextlib.ExitStack() as stack:
        assert stack.enter_context(gate.enter(_version("a"), acme)) is True
        assert stack.enter_context(gate.enter(_version("b"), acme)) is True
        assert gate.tenant_waiting == {"acme": 2} and gate.waiting == {"a": 1, "b": 1}
        with pytest.raises(GatewayError) as ei, gate.enter(_version("c"), acme):
            pass
        e = ei.value
        assert (e.status, e.code, e.retry_after) == (503, "no_capacity", 2)
        assert e.details == {"level": "tenant", "limit": "max_cold_waiters", "value": 2, "retry_after_s": 2}
        assert gate.waiting == {"a": 1, "b": 1}  # the refused request counted nowhere
        # a warm version is not waiting: never refused, never counted
        assert stack.enter_context(gate.enter(_version("warm"), acme)) is False
        # other tenants: their own count; null = unlimited
        stack.enter_context(gate.enter(_version("c"), zeta))
        stack.enter_context(gate.enter(_version("d"), zeta))
        for i in range(10):
            stack.enter_context(gate.enter(_version(f"f{i}"), free))
        assert gate.tenant_waiting == {"acme": 2, "zeta": 2, "free": 10}
    assert gate.tenant_waiting == {} and gate.waiting == {}


def test_adapter_cap_names_its_level_and_a_lowered_tenant_cap_sees_current_waiters() -> None:
    gate = ColdLoadGate(1, lambda name: False)
    with gate.enter(_version("a"), _tenant("acme", None)):
        with pytest.raises(GatewayError) as ei, gate.enter(_version("a"), _tenant("zeta", None)):
            pass
        assert ei.value.details == {
            "level": "adapter", "limit": "cold_load_queue_cap", "value": 1, "retry_after_s": 2,
        }  # fmt: skip
        # the tenant's request counted while it had no cap: a cap of 1 set now refuses the next
        with pytest.raises(GatewayError) as ei, gate.enter(_version("b"), _tenant("acme", 1)):
            pass
        assert ei.value.details is not None and ei.value.details["level"] == "tenant"
    with gate.enter(_version("b"), _tenant("acme", 1)):
        assert gate.tenant_waiting == {"acme": 1}
    with pytest.raises(GatewayError), gate.enter(_version("c"), _tenant("acme", 0)):
        pass  # 0: no request of the tenant may wait for a load
    assert gate.tenant_waiting == {} and gate.waiting == {}


def test_gate_releases_on_error() -> None:
    gate = ColdLoadGate(64, lambda name: False)
    with pytest.raises(RuntimeError), gate.enter(_version("a"), _tenant("acme", 2)):
        raise RuntimeError("upstream failed")
    assert gate.tenant_waiting == {} and gate.waiting == {}


# --------------------------------------------------------------------------- the app, fake router


def _env(cap: int | None, **settings: Any) -> Env:
    """The unit-test gateway (every version cold: the fake router holds none) with ``acme``'s cap."""
    e = Env(**settings)
    acme = dataclasses.replace(e.snap.tenants["acme"], max_cold_waiters=cap)
    e.snap = dataclasses.replace(e.snap, tenants={**e.snap.tenants, "acme": acme})
    return e


# four distinct versions acme may call (pinned ones are served whatever the active version is)
MODELS = ["demo-base:alpha", "demo-base:alpha@v2", "demo-base:beta@v1", "demo-base:beta@v2"]


async def test_app_answers_the_designed_503_and_releases_after_success() -> None:
    e = _env(2)
    await e.gw.start()
    try:
        e.router.forward_delay = 0.3
        rs = await asyncio.gather(*(e.chat(m) for m in MODELS))
        assert sorted(r.status_code for r in rs) == [200, 200, 503, 503]
        for r in rs:
            if r.status_code == 503:
                assert r.headers["retry-after"] == "2" and r.headers["x-request-id"]
                err = r.json()["error"]
                assert err["code"] == "no_capacity" and err["type"] == "server_error"
                assert err["details"] == {
                    "level": "tenant", "limit": "max_cold_waiters", "value": 2, "retry_after_s": 2,
                }  # fmt: skip
        assert e.gw.cold.tenant_waiting == {} and e.gw.cold.waiting == {}
        assert len(e.router.requests) == 2  # the refused ones never reached the router
        e.router.forward_delay = 0
        assert (await e.chat(MODELS[0])).status_code == 200
    finally:
        await e.gw.stop()


async def test_app_releases_after_router_errors_and_on_cancellation() -> None:
    e = _env(1)
    await e.gw.start()
    try:
        e.router.fail = NoCapacity("full")
        r = await e.chat(MODELS[0])
        assert r.status_code == 503 and "details" not in r.json()["error"]  # the router's own 503
        e.router.fail = RuntimeError("router bug")
        with pytest.raises(RuntimeError):
            await e.chat(MODELS[0])
        assert e.gw.cold.tenant_waiting == {}
        e.router.fail = None
        e.router.forward_delay = 5.0
        t = asyncio.create_task(e.chat(MODELS[0]))
        await asyncio.sleep(0.1)
        assert e.gw.cold.tenant_waiting == {"acme": 1}
        t.cancel()
        with pytest.raises(asyncio.CancelledError):
            await t
        assert e.gw.cold.tenant_waiting == {} and e.gw.cold.waiting == {}
    finally:
        await e.gw.stop()


async def test_client_disconnect_while_waiting_frees_the_place_at_once() -> None:
    e = _env(1)
    await e.gw.start()
    try:
        e.router.forward_delay = 30.0
        gone = asyncio.Event()
        sent: list[MutableMapping[str, Any]] = []
        body = orjson.dumps({"model": MODELS[0], "messages": MSG})
        first = [{"type": "http.request", "body": body, "more_body": False}]

        async def receive() -> dict[str, Any]:
            if first:
                return first.pop()
            await gone.wait()
            return {"type": "http.disconnect"}

        async def send(msg: MutableMapping[str, Any]) -> None:
            sent.append(msg)

        scope = {
            "type": "http", "method": "POST", "path": "/v1/chat/completions", "query_string": b"",
            "headers": [(b"authorization", f"Bearer {e.keys['acme']}".encode())],
        }  # fmt: skip
        call = asyncio.create_task(e.app(scope, receive, send))
        await asyncio.sleep(0.1)
        assert e.gw.cold.tenant_waiting == {"acme": 1}
        r = await e.chat(MODELS[1])  # the place is taken
        assert r.status_code == 503 and r.json()["error"]["details"]["level"] == "tenant"
        gone.set()
        await asyncio.wait_for(call, 2)  # long before the 30 s "load"
        assert e.gw.cold.tenant_waiting == {} and e.gw.cold.waiting == {}
        assert sent[0]["status"] == 499  # what the log line and metrics record
        e.router.forward_delay = 0
        assert (await e.chat(MODELS[1])).status_code == 200
    finally:
        await e.gw.stop()


# --------------------------------------------------------------------------- real gateway, simulators

SLOW_LOAD_S = 2.0


@pytest.fixture(scope="module")
def plat(s3_server: ls.S3Server, redis_url: str) -> Iterator[Platform]:
    with run_platform(
        s3_server,
        redis_url,
        gateways=1,  # the cap is counted per gateway process
        sim_args=("--zero-latency", "--enable-fault-control", "--max-loras", "8", "--max-cpu-loras", "16"),
        pool={"max_loras": 8, "max_adapters": 16},  # room for every adapter here: no evictions
        env={"LORAPLANE_RETIRED_IDLE_UNLOAD_S": "3600"},
    ) as p:
        a = p.admin
        tenants: list[tuple[str, dict[str, int | None] | None]] = [
            ("acme", {"max_cold_waiters": 2}),
            ("zeta", {"max_cold_waiters": 2}),
            ("free", None),
        ]
        for t, limits in tenants:
            a.create_tenant(t, limits=limits)
            p.keys[t] = a.issue_key(t)["key"]
        yield p


def _faults(p: Platform, **changes: Any) -> None:
    for url in p.sim_urls:
        httpx.post(f"{url}/_sim/faults", json=changes, timeout=5).raise_for_status()


def _gateway_revision(p: Platform) -> int:
    return int(httpx.get(f"{p.gateway_urls[0]}/readyz").json()["routing_table"]["revision"])


def _changed(p: Platform, change: Callable[[], object], timeout: float = 10.0) -> None:
    """Make registry changes; return once the gateway's routing table has moved past them and
    settled (the change feed delivered them: no restart)."""
    before = _gateway_revision(p)
    change()
    deadline = time.monotonic() + timeout
    last = before
    while time.monotonic() < deadline:
        time.sleep(0.3)
        rev = _gateway_revision(p)
        if rev > before and rev == last:
            return
        last = rev
    raise AssertionError(f"the gateway's routing table did not move on from revision {before}")


def _cold_adapters(p: Platform, tenant: str, prefix: str, n: int) -> list[str]:
    """``n`` new adapters granted to ``tenant``, loaded nowhere yet."""
    ids = [f"{prefix}-{i}" for i in range(n)]

    def make() -> None:
        for aid in ids:
            p.adapter(aid)
            p.admin.put_grant(tenant, aid)

    _changed(p, make)
    return ids


def _burst(p: Platform, tenant: str, adapters: list[str]) -> list[httpx.Response]:
    """One chat completion per adapter, all at once (threads released together)."""
    out: list[httpx.Response | None] = [None] * len(adapters)
    go = threading.Barrier(len(adapters))

    def one(i: int) -> None:
        body = {"model": f"demo-base:{adapters[i]}", "messages": MSG, "max_tokens": 3}
        headers = {"authorization": f"Bearer {p.keys[tenant]}"}
        with httpx.Client(timeout=60) as c:
            go.wait()
            out[i] = c.post(f"{p.gateway_urls[0]}/v1/chat/completions", json=body, headers=headers)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(adapters))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(r is not None for r in out)
    return [r for r in out if r is not None]


def _codes(rs: list[httpx.Response]) -> list[int]:
    return sorted(r.status_code for r in rs)


@pytest.mark.slow
def test_two_wait_three_are_refused_and_other_tenants_are_unaffected(plat: Platform) -> None:
    acme = _cold_adapters(plat, "acme", "ac", 5)
    zeta = _cold_adapters(plat, "zeta", "ze", 2)
    free = _cold_adapters(plat, "free", "fr", 5)
    _faults(plat, slow_load_s=SLOW_LOAD_S)
    try:
        results: dict[str, list[httpx.Response]] = {}
        runs = [threading.Thread(target=lambda t=t, ads=ads: results.__setitem__(t, _burst(plat, t, ads)))
                for t, ads in (("acme", acme), ("zeta", zeta), ("free", free))]  # fmt: skip
        for t in runs:
            t.start()
        for t in runs:
            t.join()
    finally:
        _faults(plat, reset=True)
    assert _codes(results["acme"]) == [200, 200, 503, 503, 503]
    for r in results["acme"]:
        if r.status_code == 503:
            assert r.headers["retry-after"] == "2"
            err = r.json()["error"]
            assert err["code"] == "no_capacity"
            assert err["details"] == {
                "level": "tenant", "limit": "max_cold_waiters", "value": 2, "retry_after_s": 2,
            }  # fmt: skip
        else:
            assert r.json()["choices"], r.text
    assert _codes(results["zeta"]) == [200, 200]  # its own count: acme's waiters do not matter
    assert _codes(results["free"]) == [200] * 5  # null = unlimited


@pytest.mark.slow
def test_limit_change_reaches_the_gateway_without_restart(plat: Platform) -> None:
    ads = _cold_adapters(plat, "zeta", "chg", 4)
    _faults(plat, slow_load_s=SLOW_LOAD_S)
    try:
        _changed(plat, lambda: plat.admin.update_tenant("zeta", limits={"max_cold_waiters": 0}))
        r = _burst(plat, "zeta", ads[:1])[0]
        assert r.status_code == 503 and r.json()["error"]["details"]["value"] == 0
        _changed(plat, lambda: plat.admin.update_tenant("zeta", limits={"max_cold_waiters": None}))
        assert _codes(_burst(plat, "zeta", ads)) == [200] * 4
    finally:
        _faults(plat, reset=True)
        _changed(plat, lambda: plat.admin.update_tenant("zeta", limits={"max_cold_waiters": 2}))


@pytest.mark.slow
def test_clients_that_give_up_free_their_places(plat: Platform) -> None:
    ads = _cold_adapters(plat, "acme", "gone", 4)
    _faults(plat, slow_load_s=4.0)
    try:
        headers = {"authorization": f"Bearer {plat.keys['acme']}"}
        url = f"{plat.gateway_urls[0]}/v1/chat/completions"

        def give_up(aid: str) -> None:
            body = {"model": f"demo-base:{aid}", "messages": MSG, "max_tokens": 3}
            with pytest.raises(httpx.ReadTimeout):
                httpx.post(url, json=body, headers=headers, timeout=httpx.Timeout(60, read=0.5))

        quitters = [threading.Thread(target=give_up, args=(aid,)) for aid in ads[:2]]
        for t in quitters:
            t.start()
        for t in quitters:
            t.join()
        time.sleep(0.3)
        # their loads run on (about 4 s); the two places are free again long before
        t0 = time.monotonic()
        rs = _burst(plat, "acme", ads[2:])
        assert _codes(rs) == [200, 200], [r.text for r in rs]
        assert time.monotonic() - t0 > 1.0  # they did wait for loads of their own
    finally:
        _faults(plat, reset=True)
