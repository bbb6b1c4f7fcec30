"""The router on simulated SGLang, Ray Serve LLM and TensorRT-LLM replicas: what each engine's
capabilities make the plane do (``router.capabilities``) — SGLang: hot adapters loaded pinned,
an adapter unloaded behind the plane's back still served (implicit reload), evictions keep the
staged files (the engine may reload from them) while disabling removes them; TensorRT-LLM: the
adapter travels in the request with the version's integer id, a cache miss is resent and served,
a version without an id is refused; Ray Serve LLM: the load is a publish, disabling unpublishes."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from kit.redis_factory import make_redis
from registry.audit_sink import MemoryAuditSink
from router.contract import AdapterLoadFailed
from simulator.procs import SimProcess, start_simulators, stop_all
from tests.router.conftest import RouterFactory
from tests.router.routerkit import chat, put_version, snapshot_of, wait_until

pytestmark = pytest.mark.xdist_group("router-engines")

ARGS = ["--zero-latency", "--enable-fault-control", "--log-level", "error", "--max-loras", "2"]


@pytest.fixture(scope="module")
def sglang_sims() -> Iterator[list[SimProcess]]:
    sims = start_simulators(2, extra_args=[*ARGS, "--max-loaded-loras", "3"], engine="sglang")
    yield sims
    stop_all(sims)


@pytest.fixture(scope="module")
def trt_sims() -> Iterator[list[SimProcess]]:
    sims = start_simulators(1, extra_args=[*ARGS, "--max-cpu-loras", "3"], engine="trtllm")
    yield sims
    stop_all(sims)


def engine_state(url: str) -> dict[str, Any]:
    return dict(httpx.get(f"{url}/_sim/engine", timeout=5).json())


def listed(url: str) -> set[str]:
    return {m["id"] for m in httpx.get(f"{url}/v1/models", timeout=5).json()["data"] if m.get("parent")}


def text(res: Any) -> str:
    return str(orjson.loads(res.body)["choices"][0]["message"]["content"])


def reset_sglang(sims: list[SimProcess]) -> None:
    for s in sims:
        for name in listed(s.url):
            httpx.post(f"{s.url}/unload_lora_adapter", json={"lora_name": name}, timeout=5)


async def test_sglang_hot_adapter_is_loaded_pinned(
    sglang_sims: list[SimProcess], make_router: RouterFactory, artifacts, tmp_path: Path
) -> None:
    reset_sglang(sglang_sims)
    hot = put_version(artifacts, tmp_path, "pinme", seed=301)
    router = await make_router([s.url for s in sglang_sims], engine="sglang", hot_prewarm_replicas=1)
    router.update_snapshot(snapshot_of(hot, hot=("pinme",)))

    def pinned() -> bool:
        regs = [r for s in sglang_sims for r in engine_state(s.url)["registry"] if r["name"] == hot.lora_name]
        return bool(regs) and all(r["pinned"] for r in regs)

    await wait_until(pinned, timeout=20)


async def test_sglang_adapter_unloaded_behind_the_planes_back_is_still_served(
    sglang_sims: list[SimProcess], make_router: RouterFactory, artifacts, tmp_path: Path
) -> None:
    reset_sglang(sglang_sims)
    v = put_version(artifacts, tmp_path, "gone-by-hand", seed=302)
    router = await make_router([sglang_sims[0].url], engine="sglang")
    router.update_snapshot(snapshot_of(v))
    first = await router.forward(chat(v))
    assert first.status == 200
    httpx.post(f"{sglang_sims[0].url}/unload_lora_adapter", json={"lora_name": v.lora_name}, timeout=5)
    again = await router.forward(chat(v))  # the plane still thinks it resident: SGLang reloads it itself
    assert again.status == 200 and text(again) == text(first)
    assert engine_state(sglang_sims[0].url)["implicit_reloads"] >= 1


async def test_sglang_a_hit_on_an_adapter_another_process_unloaded_loads_it_through_a_claim(
    sglang_sims: list[SimProcess],
    make_router: RouterFactory,
    artifacts,
    tmp_path: Path,
    redis_url: str,
    redis_prefix: str,
) -> None:
    """Two router processes share Redis; B's view is stale (it polls rarely). A evicts v1 to make
    room; B still believes v1 resident. B's request must not go to the replica as a hit: SGLang
    would reload v1 by itself, one more than ``max_adapters``. B sees the cluster's record is
    gone and loads v1 through a claim (which evicts): the replica never lists more than 2."""
    reset_sglang(sglang_sims)
    url = sglang_sims[0].url
    v1, v2, v3 = (put_version(artifacts, tmp_path, f"stale{i}", seed=320 + i) for i in range(3))
    clients = [make_redis(redis_url) for _ in range(2)]
    try:
        a = await make_router(
            [url], engine="sglang", max_adapters=2, redis=clients[0], redis_prefix=redis_prefix
        )
        b = await make_router(
            [url], engine="sglang", max_adapters=2, redis=clients[1], redis_prefix=redis_prefix,
            poll_interval_s=30.0, cluster_sync_s=30.0,
        )  # fmt: skip
        for r in (a, b):
            r.update_snapshot(snapshot_of(v1, v2, v3))
        assert (await a.forward(chat(v1))).status == 200
        assert (await b.forward(chat(v1))).status == 200  # B's view: v1 resident
        assert b.store.replicas[url].residents[v1.lora_name].state == "resident"
        await asyncio.sleep(0.6)  # B's mark on v1 lingers 0.25 s: v1 becomes evictable
        assert (await a.forward(chat(v2))).status == 200
        assert (await a.forward(chat(v3))).status == 200  # full: A evicts v1
        assert v1.lora_name not in listed(url)
        reloads = engine_state(url)["implicit_reloads"]
        again = await b.forward(chat(v1))
        assert again.status == 200
        assert len(listed(url)) <= 2 and v1.lora_name in listed(url), listed(url)
        assert engine_state(url)["implicit_reloads"] == reloads  # loaded by the plane, not behind it
    finally:
        for c in clients:
            await c.aclose()


async def test_sglang_eviction_keeps_the_staged_files_and_disable_removes_them(
    sglang_sims: list[SimProcess], make_router: RouterFactory, artifacts, tmp_path: Path
) -> None:
    reset_sglang(sglang_sims)
    vs = [put_version(artifacts, tmp_path, f"evict{i}", seed=310 + i) for i in range(3)]
    router = await make_router([sglang_sims[0].url], engine="sglang", max_loras=2, max_adapters=2)
    router.update_snapshot(snapshot_of(*vs))
    for v in vs:
        assert (await router.forward(chat(v))).status == 200
    assert vs[0].lora_name not in listed(sglang_sims[0].url)  # evicted by the plane (max_adapters 2)
    staging = tmp_path / "staging"
    assert (staging / vs[0].lora_name).is_dir()  # kept: SGLang may reload it by the name it knows
    router.update_snapshot(snapshot_of(*vs, revision=2, disabled=("evict0", "evict1", "evict2")))
    await wait_until(lambda: not any((staging / v.lora_name).exists() for v in vs), timeout=20)


async def test_trtllm_requests_carry_the_adapter_and_a_cache_miss_is_resent(
    trt_sims: list[SimProcess], make_router: RouterFactory, artifacts, tmp_path: Path
) -> None:
    url = trt_sims[0].url
    v = dataclasses.replace(put_version(artifacts, tmp_path, "trt", seed=320), int_id=4242)
    router = await make_router([url], engine="trtllm")
    router.update_snapshot(snapshot_of(v))
    first = await router.forward(chat(v))
    assert first.status == 200
    tasks = engine_state(url)["tasks"]
    assert tasks["4242"]["lora_name"] == v.lora_name
    assert Path(tasks["4242"]["path"]) == (tmp_path / "staging" / v.lora_name).resolve()
    httpx.post(f"{url}/_sim/engine", json={"evict_next": 1}, timeout=5).raise_for_status()
    again = await router.forward(chat(v))  # 400 cache miss → stage again, resend
    assert again.status == 200 and text(again) == text(first)
    assert engine_state(url)["cache_misses"] == 1


async def test_trtllm_version_without_an_integer_id_is_refused(
    trt_sims: list[SimProcess], make_router: RouterFactory, artifacts, tmp_path: Path
) -> None:
    v = put_version(artifacts, tmp_path, "no-id", seed=330)  # int_id 0: not from the registry
    router = await make_router([trt_sims[0].url], engine="trtllm")
    router.update_snapshot(snapshot_of(v))
    with pytest.raises(AdapterLoadFailed, match="no integer id"):
        await router.forward(chat(v))


async def test_ray_serve_load_is_a_publish_and_disable_unpublishes(
    make_router: RouterFactory, artifacts, audit: MemoryAuditSink, tmp_path: Path
) -> None:
    published = tmp_path / "published"
    published.mkdir()
    uri = f"file://{published}"
    sims = start_simulators(1, extra_args=[*ARGS, "--dynamic-lora-loading-path", uri], engine="ray-serve")
    try:
        v = put_version(artifacts, tmp_path, "rayed", seed=340)
        router = await make_router([sims[0].url], engine="ray-serve", staging={"mode": "publish", "uri": uri})
        router.update_snapshot(snapshot_of(v))
        assert (await router.forward(chat(v))).status == 200
        assert sorted(p.name for p in (published / v.lora_name).iterdir()) == [
            "adapter_config.json",
            "adapter_model.safetensors",
        ]
        assert engine_state(sims[0].url)["first_hits"] == 1
        assert any(e["action"] == "adapter.loaded" for e in audit.events)
        router.update_snapshot(snapshot_of(v, revision=2, disabled=("rayed",)))
        await wait_until(lambda: not (published / v.lora_name).exists(), timeout=20)
    finally:
        stop_all(sims)
