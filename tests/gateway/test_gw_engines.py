"""The platform tests per engine (issue 27.4): the same gateway, cold load, eviction, canary,
promotion, fallback and disable behaviour through two real gateway processes, PostgreSQL, Redis
and S3, with simulated SGLang, Ray Serve LLM (publishing to S3) and TensorRT-LLM replicas — the
vLLM flavour runs the whole of tests/gateway. What differs per engine is only what the engine
does itself (``router.capabilities``): SGLang lists what it holds and the plane keeps it within
``max_adapters``; Ray Serve LLM is served from what is published, never evicted for room, and
unpublished on disable; TensorRT-LLM is told the adapter in every request."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from kit import localservices as ls

from .gw_platform import Platform, run_platform

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("gw-engines")]

ENGINES = ["sglang", "ray-serve", "trtllm"]
MSG: Any = [{"role": "user", "content": "Say hello"}]


@pytest.fixture(scope="module", params=ENGINES)
def plat(request: pytest.FixtureRequest, s3_server: ls.S3Server, redis_url: str) -> Iterator[Platform]:
    env = {"LORAPLANE_RETIRED_IDLE_UNLOAD_S": "3600", "LORAPLANE_OUTLIER_FAILURES": "1000"}
    with run_platform(s3_server, redis_url, engine=request.param, env=env) as p:
        p.admin.create_tenant("acme", limits={"rpm": 100_000, "tpm": 100_000_000}, base_model_access=True)
        p.keys["acme"] = p.admin.issue_key("acme")["key"]
        yield p


def grant(p: Platform, adapter_id: str, versions: int = 1, promote: str | None = "v1") -> None:
    p.adapter(adapter_id, versions=versions, promote=promote)
    p.admin.put_grant("acme", adapter_id)


def post(p: Platform, model: str, gw: int = 0, **extra: Any) -> httpx.Response:
    return httpx.post(
        f"{p.gateway_urls[gw]}/v1/chat/completions",
        headers={"authorization": f"Bearer {p.keys['acme']}"},
        json={"model": model, "messages": MSG, "max_tokens": 3, **extra},
        timeout=60,
    )


def eventually(what: str, cond: Any, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def served(p: Platform, adapter_id: str, n: int) -> set[str]:
    out = set()
    for i in range(n):
        r = post(p, f"demo-base:{adapter_id}", gw=i % 2)
        assert r.status_code == 200, r.text
        out.add(r.headers["x-loraplane-adapter-version"])
    return out


def test_cold_load_chat_completions_and_streams_through_the_openai_client(plat: Platform) -> None:
    grant(plat, "first")
    eventually("the grant", lambda: post(plat, "demo-base:first").status_code == 200)
    c = openai.OpenAI(base_url=f"{plat.gateway_urls[1]}/v1", api_key=plat.keys["acme"], max_retries=0)
    chat = c.chat.completions.create(model="demo-base:first", messages=MSG, max_tokens=4)
    assert chat.model == "demo-base:first" and chat.choices[0].message.content
    comp = c.completions.create(model="demo-base:first", prompt="x", max_tokens=4)
    assert comp.model == "demo-base:first" and comp.choices[0].text
    chunks = list(c.chat.completions.create(model="demo-base:first", messages=MSG, max_tokens=4, stream=True))
    assert chunks and all(ch.model == "demo-base:first" for ch in chunks)
    base = c.chat.completions.create(model="demo-base", messages=MSG, max_tokens=2)
    assert base.model == "demo-base"


def test_canary_split_then_promote_and_rollback_reach_both_gateways(plat: Platform) -> None:
    grant(plat, "canary", versions=2)
    eventually("the grant", lambda: post(plat, "demo-base:canary").status_code == 200)
    plat.admin.promote("canary", "v2", canary_weight=50)
    eventually("the split", lambda: served(plat, "canary", 30) == {"v1", "v2"})
    plat.admin.promote("canary", "v2")
    eventually("the promotion", lambda: served(plat, "canary", 6) == {"v2"})
    plat.admin.rollback("canary")
    eventually("the rollback", lambda: served(plat, "canary", 6) == {"v1"})


def test_a_version_that_fails_verification_falls_back_to_the_previous_one(
    plat: Platform, s3_server: ls.S3Server
) -> None:
    aid = "fallback"
    plat.admin.create_adapter(aid, "demo-base", owner="e2e")
    plat.admin.request("PATCH", f"/adapters/{aid}", json_body={"on_load_failure": "previous_version"})
    plat.upload(aid, seed=501)
    plat.admin.promote(aid, "v1")
    plat.admin.put_grant("acme", aid)
    eventually("v1 served", lambda: post(plat, f"demo-base:{aid}").status_code == 200)
    plat.upload(aid, seed=502)
    uri = plat.admin.get_version(aid, "v2")["storage_uri"]
    bucket, _, prefix = uri.removeprefix("s3://").partition("/")
    s3_server.client().put_object(Bucket=bucket, Key=f"{prefix}adapter_model.safetensors", Body=b"tampered")
    plat.admin.promote(aid, "v2")
    eventually(
        "the promotion",
        lambda: post(plat, f"demo-base:{aid}").headers.get("x-loraplane-fallback") is not None,
    )
    r = post(plat, f"demo-base:{aid}")
    assert r.status_code == 200
    assert (r.headers["x-loraplane-fallback"], r.headers["x-loraplane-adapter-version"]) == (
        "previous_version",
        "v1",
    )


def _held(p: Platform, url: str) -> set[str]:
    """What a replica holds as the engine says (SGLang's /v1/models), or the plane's records."""
    if p.engine == "sglang":
        cards = httpx.get(f"{url}/v1/models", timeout=5).json()["data"]
        return {c["id"] for c in cards if c.get("parent")}
    rec = next(r for r in p.admin.list_replicas() if r["url"] == url)
    return {a["lora_name"] for a in rec["adapters"] if a["state"] == "resident"}


def test_many_adapters_stay_within_the_bound_the_engine_has(plat: Platform) -> None:
    names = [f"many-{i}" for i in range(11)]
    for n in names:
        grant(plat, n)
    eventually("the grants", lambda: post(plat, f"demo-base:{names[-1]}").status_code == 200)
    for n in names:
        assert post(plat, f"demo-base:{n}").status_code == 200
    if plat.engine == "ray-serve":
        # the engine's own LRU bounds each Ray replica; the plane never evicts for room: everything
        # requested stays published (and servable); the records reach the admin API within the
        # gateways' publish interval

        def recorded() -> set[str]:
            held = set().union(*(_held(plat, u) for u in plat.sim_urls))
            return {h.split("@")[0] for h in held if h.startswith("many-")}

        eventually("every adapter recorded", lambda: recorded() == set(names))
    else:  # max_adapters 8 per replica: SGLang's listing, TensorRT-LLM's ledger
        for u in plat.sim_urls:
            eventually("the bound", lambda u=u: len(_held(plat, u)) <= 8)
    for n in names:  # and everything still serves
        assert post(plat, f"demo-base:{n}").status_code == 200


def test_disable_lets_the_engine_go_of_the_adapter(plat: Platform, s3_server: ls.S3Server) -> None:
    grant(plat, "gone")
    eventually("served", lambda: post(plat, "demo-base:gone").status_code == 200)
    plat.admin.disable_adapter("gone")
    eventually("403", lambda: post(plat, "demo-base:gone").status_code == 403)
    engine = plat.engine
    if engine == "sglang":
        eventually(
            "unloaded", lambda: not any(h.startswith("gone@") for u in plat.sim_urls for h in _held(plat, u))
        )
    elif engine == "trtllm":
        staging = plat.workdir / "staging"
        eventually("unstaged", lambda: not any(p.name.startswith("gone@") for p in staging.iterdir()))
    else:  # ray-serve: unpublished, so no Ray replica can load it again
        bucket = plat.bucket

        def published() -> list[str]:
            listed = s3_server.client().list_objects_v2(Bucket=bucket, Prefix="published/gone@")
            return [o["Key"] for o in listed.get("Contents", [])]

        eventually("unpublished", lambda: published() == [])
