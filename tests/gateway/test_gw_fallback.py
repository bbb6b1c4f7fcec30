"""Load-failure fallback (SPEC §15) through the real gateway processes with simulator replicas:
for each ``on_load_failure`` policy, a version whose load is refused, times out, whose stored
object was tampered with, streaming and not, or that finds no capacity (the router's cap on the
requests waiting for one adapter's load); pinned versions never fall back."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from kit import localservices as ls

from .gw_platform import Platform, run_platform

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("gw-fallback")]

MSG = [{"role": "user", "content": "hello"}]
POLICIES = ("error", "previous_version", "base_model")


@contextlib.contextmanager
def platform(
    s3_server: ls.S3Server, redis_url: str, sims: int, env: dict[str, str] | None = None
) -> Iterator[Platform]:
    with run_platform(
        s3_server,
        redis_url,
        gateways=1,
        sims=sims,
        sim_args=("--zero-latency", "--enable-fault-control"),
        env={
            "LORAPLANE_LOAD_TIMEOUT_S": "1.5",
            "LORAPLANE_RETIRED_IDLE_UNLOAD_S": "3600",
            "LORAPLANE_OUTLIER_FAILURES": "1000",  # the refusals here are on purpose
            **(env or {}),
        },
    ) as p:
        p.admin.create_tenant("acme", limits={"rpm": 100_000})
        p.keys["acme"] = p.admin.issue_key("acme")["key"]
        yield p


@pytest.fixture(scope="module")
def plat(s3_server: ls.S3Server, redis_url: str) -> Iterator[Platform]:
    with platform(s3_server, redis_url, sims=2) as p:
        yield p


@pytest.fixture(scope="module")
def plat1(s3_server: ls.S3Server, redis_url: str) -> Iterator[Platform]:
    """One replica, where one request at a time may wait for an adapter's load: a second one finds
    no capacity (the router's 503 ``no_capacity``, raised before any load of its own)."""
    env = {"LORAPLANE_MAX_COLD_WAITERS_PER_ADAPTER": "1", "LORAPLANE_LOAD_TIMEOUT_S": "10"}
    with platform(s3_server, redis_url, sims=1, env=env) as p:
        yield p


def faults(p: Platform, **changes: Any) -> None:
    for url in p.sim_urls:
        httpx.post(f"{url}/_sim/faults", json=changes, timeout=5).raise_for_status()


def call(p: Platform, model: str, *, stream: bool = False) -> tuple[int, dict[str, str], str]:
    """(status, headers, text or the concatenated SSE data) of one chat completion."""
    headers = {"authorization": f"Bearer {p.keys['acme']}"}
    body = {"model": model, "messages": MSG, "max_tokens": 3, "stream": stream}
    url = f"{p.gateway_urls[0]}/v1/chat/completions"
    with httpx.stream("POST", url, headers=headers, json=body, timeout=60) as r:
        text = r.read().decode()
        return r.status_code, dict(r.headers), text


def audit_events(p: Platform, action: str, adapter_id: str, timeout: float = 10.0) -> list[dict[str, Any]]:
    """The adapter's audit events of ``action`` (the router writes them in the background)."""
    deadline = time.monotonic() + timeout
    while True:
        events = p.admin.list_audit(action=action, subject_id=adapter_id)
        if events or time.monotonic() > deadline:
            return events
        time.sleep(0.2)


def two_versions(p: Platform, adapter_id: str, policy: str) -> None:
    """v1 served once (resident), then v2 promoted over it (v2.rollback_to = v1)."""
    p.admin.create_adapter(adapter_id, "demo-base", owner="e2e")
    p.admin.request("PATCH", f"/adapters/{adapter_id}", json_body={"on_load_failure": policy})
    p.upload(adapter_id, seed=abs(hash(adapter_id)) % 1000)
    p.admin.promote(adapter_id, "v1")
    p.admin.put_grant("acme", adapter_id)
    time.sleep(0.5)
    assert call(p, f"demo-base:{adapter_id}")[0] == 200  # v1 resident now
    p.upload(adapter_id, seed=abs(hash(adapter_id)) % 1000 + 1)
    p.admin.promote(adapter_id, "v2")
    time.sleep(0.5)


def check(
    p: Platform, adapter_id: str, policy: str, stream: bool, error: str = "adapter_load_failed"
) -> None:
    status, headers, text = call(p, f"demo-base:{adapter_id}", stream=stream)
    if policy == "error":
        assert status == 503 and f'"code":"{error}"' in text.replace(" ", ""), (status, text)
        assert "x-loraplane-fallback" not in headers
        return
    assert status == 200, text
    assert headers["x-loraplane-fallback"] == policy
    served = "v1" if policy == "previous_version" else "base"
    assert headers["x-loraplane-adapter-version"] == served
    assert f'"model":"demo-base:{adapter_id}"' in text.replace(" ", "")
    if stream:
        assert text.rstrip().endswith("data: [DONE]")


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
@pytest.mark.parametrize("policy", POLICIES)
def test_refused_load_follows_the_policy(plat: Platform, policy: str, stream: bool) -> None:
    aid = f"ref-{policy.replace('_', '')[:8]}-{int(stream)}"
    two_versions(plat, aid, policy)
    faults(plat, fail_loads=1, fail_load_status=500)  # v2 refused on both replicas (one retry)
    try:
        check(plat, aid, policy, stream)
    finally:
        faults(plat, reset=True)


@pytest.mark.parametrize("policy", POLICIES)
def test_load_timeout_follows_the_policy(plat: Platform, policy: str) -> None:
    aid = f"slow-{policy.replace('_', '')[:8]}"
    two_versions(plat, aid, policy)
    faults(plat, slow_load_s=4.0)  # over LORAPLANE_LOAD_TIMEOUT_S=1.5 on both replicas
    try:
        check(plat, aid, policy, stream=False)
    finally:
        faults(plat, reset=True)


@pytest.mark.parametrize("policy", POLICIES)
def test_tampered_object_follows_the_policy(plat: Platform, policy: str, s3_server: ls.S3Server) -> None:
    aid = f"bad-{policy.replace('_', '')[:8]}"
    two_versions(plat, aid, policy)
    uri = plat.admin.get_version(aid, "v2")["storage_uri"]
    bucket, _, prefix = uri.removeprefix("s3://").partition("/")
    s3_server.client().put_object(Bucket=bucket, Key=f"{prefix}adapter_model.safetensors", Body=b"tampered")
    check(plat, aid, policy, stream=True)
    assert audit_events(plat, "adapter.hash_mismatch", aid)


def sim_state(p: Platform) -> dict[str, Any]:
    return dict(httpx.get(f"{p.sim_urls[0]}/_sim/state", timeout=5).raise_for_status().json())


def wait_for(what: str, cond: Any, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


@pytest.mark.parametrize("policy", POLICIES)
def test_no_capacity_follows_the_policy(plat1: Platform, policy: str) -> None:
    p = plat1
    aid = f"full-{policy.replace('_', '')[:8]}"
    two_versions(p, aid, policy)
    calls = sim_state(p)["load_calls"]
    faults(p, slow_load_s=4.0)  # v2's load takes 4 s (the load timeout here is 10 s)
    with ThreadPoolExecutor(1) as pool:
        first = pool.submit(call, p, f"demo-base:{aid}")  # the one request allowed to wait for v2
        try:
            wait_for("v2's load", lambda: sim_state(p)["load_calls"] > calls)
            check(p, aid, policy, stream=False, error="no_capacity")  # a second one: no capacity
            assert not first.done()  # answered at once, while the first still waits for the load
        finally:
            faults(p, reset=True)
            status, headers, text = first.result()
    assert status == 200 and headers["x-loraplane-adapter-version"] == "v2", (status, text)
    assert "x-loraplane-fallback" not in headers
    if policy != "error":
        events = audit_events(p, "adapter.fallback", aid)
        assert events and "waiting for adapter" in events[0]["details"]["reason"], events


def test_pinned_version_never_falls_back_and_fallbacks_are_counted_and_audited(plat: Platform) -> None:
    aid = "pinned-prev"
    two_versions(plat, aid, "previous_version")
    faults(plat, fail_loads=2, fail_load_status=500)
    try:
        status, headers, text = call(plat, f"demo-base:{aid}@v2")
        assert status == 503 and "adapter_load_failed" in text and "x-loraplane-fallback" not in headers
    finally:
        faults(plat, reset=True)
    for _ in range(2):  # two fallbacks within a minute: one audit event, one count
        faults(plat, fail_loads=1, fail_load_status=500)
        assert call(plat, f"demo-base:{aid}")[1]["x-loraplane-fallback"] == "previous_version"
    faults(plat, reset=True)
    m = httpx.get(f"{plat.internal_urls[0]}/metrics").text
    got = [
        s.value
        for fam in text_string_to_metric_families(m)
        for s in fam.samples
        if s.name == "loraplane_fallbacks_total"
        and s.labels == {"adapter": aid, "version": "v2", "kind": "previous_version", "served_version": "v1"}
    ]
    assert got == [2.0]
    events = audit_events(plat, "adapter.fallback", aid)
    assert len(events) == 1 and events[0]["actor"] == "router"
    assert events[0]["details"]["kind"] == "previous_version" and events[0]["details"]["served"] == "v1"
