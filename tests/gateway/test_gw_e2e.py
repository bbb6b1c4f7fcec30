"""End to end on real processes: PostgreSQL, Redis, S3 (SeaweedFS), two simulator replicas, the
admin API and TWO gateway processes (`loraplane serve`), driven with the official openai client."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import openai
import pytest

from kit import localservices as ls

from .gw_platform import ADMIN_TOKEN, Platform, run_platform

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("gw-e2e")]


@pytest.fixture(scope="module")
def plat(s3_server: ls.S3Server, redis_url: str) -> Iterator[Platform]:
    with run_platform(s3_server, redis_url) as p:
        a = p.admin
        p.adapter("alpha", versions=2)
        p.adapter("beta")
        p.adapter("hidden")
        p.adapter("off")
        p.adapter("flip", versions=2)
        p.adapter("canary", versions=2)
        a.promote("canary", "v2", canary_weight=30)
        p.adapter("fresh", versions=1, promote=None)
        a.create_tenant("acme", limits={"rpm": 10000, "tpm": 10_000_000}, base_model_access=True)
        for ad in ("alpha", "beta", "off", "flip", "canary", "fresh"):
            a.put_grant("acme", ad)
        a.disable_adapter("off")
        a.create_tenant("tight", limits={"rpm": 4})
        a.put_grant("tight", "alpha")
        a.create_tenant("nobody")
        for t in ("acme", "tight", "nobody"):
            p.keys[t] = a.issue_key(t)["key"]
        wait_revision(p)
        yield p


def wait_revision(p: Platform, timeout: float = 5.0) -> None:
    """Until both gateways see the tenants (the feed delivered the latest revision)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        revs = {httpx.get(f"{u}/readyz").json()["routing_table"]["revision"] for u in p.gateway_urls}
        ok = all(
            httpx.get(f"{u}/v1/models", headers={"authorization": f"Bearer {p.keys['nobody']}"}).status_code
            == 200
            for u in p.gateway_urls
        )
        if ok and len(revs) == 1:
            return
        time.sleep(0.05)
    raise AssertionError("gateways did not converge on the latest revision")


def client(p: Platform, tenant: str = "acme", gw: int = 0) -> openai.OpenAI:
    return openai.OpenAI(
        base_url=f"{p.gateway_urls[gw]}/v1", api_key=p.keys[tenant], max_retries=0, timeout=30
    )


MSG: Any = [{"role": "user", "content": "Say hello"}]


def test_chat_and_completions_with_openai_client(plat: Platform) -> None:
    c = client(plat)
    raw = c.chat.completions.with_raw_response.create(model="demo-base:alpha", messages=MSG, max_tokens=8)
    r = raw.parse()
    assert r.model == "demo-base:alpha"
    assert r.choices[0].message.content
    assert r.usage is not None and r.usage.completion_tokens > 0
    assert raw.headers["x-loraplane-adapter-version"] == "v1"
    assert raw.headers["x-request-id"]
    comp = c.completions.create(model="demo-base:beta", prompt="Once upon", max_tokens=5)
    assert comp.model == "demo-base:beta" and comp.choices[0].text
    base = c.chat.completions.create(model="demo-base", messages=MSG, max_tokens=4)
    assert base.model == "demo-base"
    # different adapters answer differently (deterministic simulator outputs depend on the weights)
    a = c.chat.completions.create(model="demo-base:alpha", messages=MSG, max_tokens=12, seed=1)
    b = c.chat.completions.create(model="demo-base:beta", messages=MSG, max_tokens=12, seed=1)
    assert a.choices[0].message.content != b.choices[0].message.content


def test_streaming_with_and_without_usage(plat: Platform) -> None:
    c = client(plat, gw=1)
    chunks = list(c.chat.completions.create(model="demo-base:alpha", messages=MSG, max_tokens=6, stream=True))
    assert len(chunks) >= 2
    assert all(ch.model == "demo-base:alpha" for ch in chunks)
    assert all(ch.usage is None for ch in chunks)
    chunks = list(
        c.chat.completions.create(
            model="demo-base:alpha",
            messages=MSG,
            max_tokens=6,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    usage = [ch.usage for ch in chunks if ch.usage is not None]
    assert len(usage) == 1 and usage[0].completion_tokens > 0 and chunks[-1].choices == []
    text = list(c.completions.create(model="demo-base:beta", prompt="x", max_tokens=4, stream=True))
    assert all(t.model == "demo-base:beta" for t in text) and "".join(
        t.choices[0].text for t in text if t.choices
    )


def test_models_list_only_what_tenant_may_use(plat: Platform) -> None:
    ids = sorted(m.id for m in client(plat).models.list())
    assert ids == ["demo-base", "demo-base:alpha", "demo-base:beta", "demo-base:canary", "demo-base:flip"]
    assert [m.id for m in client(plat, "tight").models.list()] == ["demo-base:alpha"]
    assert list(client(plat, "nobody").models.list()) == []


def test_error_codes_through_the_openai_client(plat: Platform) -> None:
    c = client(plat)
    bodies = []
    for model in ["demo-base:hidden", "demo-base:nosuch", "nosuch-base", "demo-base:fresh"]:
        with pytest.raises(openai.NotFoundError) as ei:
            c.chat.completions.create(model=model, messages=MSG)
        err = ei.value.body
        assert isinstance(err, dict) and err["code"] == "model_not_found" and err["type"] == "not_found_error"
        bodies.append(err["message"].replace(model, "M"))
    assert len(set(bodies)) == 1  # not granted (hidden) and unknown give identical answers
    with pytest.raises(openai.PermissionDeniedError) as pe:
        c.chat.completions.create(model="demo-base:off", messages=MSG)
    assert pe.value.body["code"] == "adapter_disabled"  # type: ignore[index]
    with pytest.raises(openai.BadRequestError):
        c.chat.completions.create(model="demo-base:alpha", messages=[])
    for bad in ["lp-not-a-key", ADMIN_TOKEN]:
        bad_client = openai.OpenAI(base_url=f"{plat.gateway_urls[0]}/v1", api_key=bad, max_retries=0)
        with pytest.raises(openai.AuthenticationError) as ae:
            bad_client.chat.completions.create(model="demo-base:alpha", messages=MSG)
        assert ae.value.body["code"] == "invalid_api_key"  # type: ignore[index]
    # a tenant key never works on the admin API
    r = httpx.get(
        f"{plat.admin_url}/admin/v1/adapters", headers={"authorization": f"Bearer {plat.keys['acme']}"}
    )
    assert r.status_code == 401
    # the pinned version of an adapter with no active version is served; a bad pin is 404
    fresh = c.chat.completions.with_raw_response.create(
        model="demo-base:fresh@v1", messages=MSG, max_tokens=3
    )
    assert fresh.headers["x-loraplane-adapter-version"] == "v1"
    assert fresh.parse().model == "demo-base:fresh@v1"


def test_pinned_version_and_version_disabled(plat: Platform) -> None:
    c = client(plat)
    raw = c.chat.completions.with_raw_response.create(model="demo-base:alpha@v2", messages=MSG, max_tokens=3)
    assert raw.headers["x-loraplane-adapter-version"] == "v2" and raw.parse().model == "demo-base:alpha@v2"
    plat.admin.create_adapter("pinoff", "demo-base")
    plat.upload("pinoff", 7)
    plat.upload("pinoff", 8)
    plat.admin.promote("pinoff", "v1")
    plat.admin.put_grant("acme", "pinoff")
    plat.admin.disable_version("pinoff", "v2")
    wait_revision(plat)
    with pytest.raises(openai.PermissionDeniedError) as pe:
        c.chat.completions.create(model="demo-base:pinoff@v2", messages=MSG)
    assert pe.value.body["code"] == "version_disabled"  # type: ignore[index]


def test_rate_limit_holds_across_two_gateways(plat: Platform) -> None:
    answers = []

    def one(i: int) -> int:
        r = httpx.post(
            f"{plat.gateway_urls[i % 2]}/v1/chat/completions",
            headers={"authorization": f"Bearer {plat.keys['tight']}"},
            json={"model": "demo-base:alpha", "messages": MSG, "max_tokens": 2},
            timeout=30,
        )
        answers.append(r)
        return r.status_code

    with ThreadPoolExecutor(8) as pool:
        codes = list(pool.map(one, range(10)))
    assert codes.count(200) == 4 and codes.count(429) == 6
    rej = next(r for r in answers if r.status_code == 429)
    assert (
        rej.json()["error"]["code"] == "rate_limit_exceeded"
        and "requests per minute" in rej.json()["error"]["message"]
    )
    assert int(rej.headers["retry-after"]) >= 1
    assert (
        rej.headers["x-ratelimit-limit-requests"] == "4"
        and rej.headers["x-ratelimit-remaining-requests"] == "0"
    )
    with pytest.raises(openai.RateLimitError):
        client(plat, "tight", gw=1).chat.completions.create(model="demo-base:alpha", messages=MSG)
    # GET /v1/models never counts
    assert (
        httpx.get(
            f"{plat.gateway_urls[0]}/v1/models", headers={"authorization": f"Bearer {plat.keys['tight']}"}
        ).status_code
        == 200
    )


def _served_version(url: str, key: str) -> str:
    r = httpx.post(
        f"{url}/v1/completions",
        headers={"authorization": f"Bearer {key}"},
        json={"model": "demo-base:flip", "prompt": "x", "max_tokens": 1},
        timeout=30,
    )
    assert r.status_code == 200, r.text
    return r.headers["x-loraplane-adapter-version"]


def _in_force_after(plat: Platform, change: Callable[[], object], version: str) -> tuple[float, list[dict]]:
    """Seconds from the admin call's return until both gateways installed the new revision
    (their own ``changed_at`` clock, so polling overhead is not counted); then both serve ``version``.
    Also each gateway's table status (notification time, load time) for the failure message."""
    before = [httpx.get(f"{u}/readyz").json()["routing_table"]["revision"] for u in plat.gateway_urls]
    change()
    returned = time.time()
    lat = []
    tables = []
    for u, rev in zip(plat.gateway_urls, before, strict=True):
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            table = httpx.get(f"{plat.internal(u)}/readyz").json()["routing_table"]
            if table["revision"] > rev:
                lat.append(max(0.0, table["changed_at"] - returned))
                tables.append({**table, "notified_after_s": (table["notified_at"] or returned) - returned})
                break
            time.sleep(0.005)
        else:
            raise AssertionError(f"{u} never saw the change")
        assert _served_version(u, plat.keys["acme"]) == version
    return max(lat), tables


def test_promote_and_rollback_seen_by_both_gateways_within_1s(plat: Platform) -> None:
    assert {_served_version(u, plat.keys["acme"]) for u in plat.gateway_urls} == {"v1"}
    times: list[float] = []
    details: list[object] = []
    for _ in range(3):
        promote_s, t1 = _in_force_after(plat, lambda: plat.admin.promote("flip", "v2"), "v2")
        rollback_s, t2 = _in_force_after(plat, lambda: plat.admin.rollback("flip"), "v1")
        times += [promote_s, rollback_s]
        details += [t1, t2]
    print("\nchange in force on both gateways (ms):", [round(t * 1000, 1) for t in times])
    # Target well under 100 ms. The bound is the SPEC's worst case (1 s) for the median change,
    # with room for a shared, heavily loaded test machine on the slowest one.
    assert sorted(times)[len(times) // 2] < 1.0 and max(times) < 3.0, details
    plat.admin.disable_adapter("flip")
    t0 = time.perf_counter()
    for u in plat.gateway_urls:
        while time.perf_counter() - t0 < 5.0:
            r = httpx.post(
                f"{u}/v1/completions",
                headers={"authorization": f"Bearer {plat.keys['acme']}"},
                json={"model": "demo-base:flip", "prompt": "x", "max_tokens": 1},
            )
            if r.status_code == 403:
                break
        assert r.status_code == 403 and r.json()["error"]["code"] == "adapter_disabled"
    plat.admin.enable_adapter("flip")


def test_canary_split_and_sticky_users(plat: Platform) -> None:
    key = plat.keys["acme"]
    versions = []
    with httpx.Client(timeout=30) as h:
        for i in range(80):
            r = h.post(
                f"{plat.gateway_urls[i % 2]}/v1/completions",
                headers={"authorization": f"Bearer {key}"},
                json={"model": "demo-base:canary", "prompt": "x", "max_tokens": 1},
            )
            versions.append(r.headers["x-loraplane-adapter-version"])
        share = versions.count("v2") / len(versions)
        assert 0.1 <= share <= 0.5, share  # canary_weight 30
        for user in ["ann", "bob", "cy", "dee"]:
            seen = set()
            for i in range(6):  # both gateway processes agree
                r = h.post(
                    f"{plat.gateway_urls[i % 2]}/v1/completions",
                    headers={"authorization": f"Bearer {key}"},
                    json={"model": "demo-base:canary", "prompt": "x", "max_tokens": 1, "user": user},
                )
                seen.add(r.headers["x-loraplane-adapter-version"])
            assert len(seen) == 1


def test_request_id_readyz_metrics(plat: Platform) -> None:
    u = plat.gateway_urls[0]
    r = httpx.post(
        f"{u}/v1/chat/completions",
        headers={"authorization": f"Bearer {plat.keys['acme']}", "x-request-id": "req-e2e-1"},
        json={"model": "demo-base:alpha", "messages": MSG, "max_tokens": 2},
    )
    assert r.status_code == 200 and r.headers["x-request-id"] == "req-e2e-1"
    ready = httpx.get(f"{u}/readyz").json()
    assert ready["ready"] and ready["replicas_healthy"] == 2
    assert ready["ratelimit"] == {"healthy": True, "on_error": "closed"}
    assert not ready["routing_table"]["stale"]
    detail = httpx.get(f"{plat.internal(u)}/readyz").json()
    assert detail["ratelimit"] == {"backend": "redis", "healthy": True, "on_error": "closed"}
    assert httpx.get(f"{u}/metrics").status_code == 404  # the internal port's, not the public one's
    m = httpx.get(f"{plat.internal(u)}/metrics").text
    assert (
        'loraplane_gateway_requests_total{adapter="alpha",code="200",endpoint="chat/completions",'
        'served_version="v1",tenant="acme"' in m
    )
    assert "loraplane_gateway_ttft_seconds_bucket" in m
