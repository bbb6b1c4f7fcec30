"""Several gateways, one cluster (SPEC §17), per engine (issue 27.4): three ``loraplane serve
--role gateway`` processes in front of simulated SGLang, Ray Serve LLM and TensorRT-LLM replicas.
Concurrent first requests from every gateway make one load per replica — counted by the engines
themselves (SGLang's load calls, Ray's first-hit downloads, TensorRT-LLM's weight loads) — and
under concurrent pressure an SGLang replica never lists more than ``max_adapters`` — the plane
makes the room, SGLang's own LRU (``--max-loaded-loras``, the same bound) never has to."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest

from kit import localservices as ls
from tests.gateway.gw_platform import Platform, run_platform

pytestmark = [pytest.mark.cluster, pytest.mark.xdist_group("cluster-engines")]

MAX_ADAPTERS = 3
MSG = [{"role": "user", "content": "hello"}]


@pytest.fixture(scope="module", params=["sglang", "ray-serve", "trtllm"])
def cluster(request: pytest.FixtureRequest, s3_server: ls.S3Server, redis_url: str) -> Iterator[Platform]:
    extra = ["--max-loaded-loras", str(MAX_ADAPTERS)] if request.param == "sglang" else []
    with run_platform(
        s3_server,
        redis_url,
        gateways=3,
        sims=2,
        engine=request.param,
        sim_args=("--max-loras", "2", "--load-fixed-s", "0.2", "--enable-fault-control", *extra),
        pool={"max_loras": 2, "max_adapters": MAX_ADAPTERS},
        env={"LORAPLANE_RECONCILE_INTERVAL_S": "0.5", "LORAPLANE_RETIRED_IDLE_UNLOAD_S": "3600"},
    ) as p:
        p.admin.create_tenant("acme", limits={"rpm": 100_000, "tpm": 100_000_000})
        for i in range(8):
            p.adapter(f"ad{i}")
            p.admin.put_grant("acme", f"ad{i}")
        p.keys["acme"] = p.admin.issue_key("acme")["key"]
        time.sleep(1.0)  # every gateway has the tenant and grants
        yield p


def chat(url: str, key: str, model: str) -> httpx.Response:
    return httpx.post(
        f"{url}/v1/chat/completions",
        headers={"authorization": f"Bearer {key}"},
        json={"model": model, "messages": MSG, "max_tokens": 2},
        timeout=60.0,
    )


def engine_loads(p: Platform, url: str) -> int:
    """The loads the engine itself made (not the plane's calls): first downloads for Ray,
    weight loads for TensorRT-LLM, load calls for SGLang."""
    if p.engine == "sglang":
        return int(httpx.get(f"{url}/_sim/state", timeout=5).json()["load_calls"])
    state = httpx.get(f"{url}/_sim/engine", timeout=5).json()
    return int(state["first_hits"] if p.engine == "ray-serve" else state["weight_loads"])


def audit(p: Platform, action: str, adapter: str) -> list[dict[str, Any]]:
    return [e for e in p.admin.list_audit(action=action, subject_id=adapter) if e["action"] == action]


def test_concurrent_first_requests_from_three_gateways_load_once_per_replica(cluster: Platform) -> None:
    p = cluster
    before = {u: engine_loads(p, u) for u in p.sim_urls}
    urls = p.gateway_urls * 4  # 12 concurrent cold requests, 4 through each gateway
    with ThreadPoolExecutor(len(urls)) as pool:
        answers = list(pool.map(lambda u: chat(u, p.keys["acme"], "demo-base:ad0"), urls))
    failed = [r.text for r in answers if r.status_code != 200]
    assert [r.status_code for r in answers] == [200] * len(urls), failed
    deadline = time.monotonic() + 10
    while not audit(p, "adapter.loaded", "ad0") and time.monotonic() < deadline:
        time.sleep(0.1)
    time.sleep(1.0)
    replicas = [e["details"]["replica"] for e in audit(p, "adapter.loaded", "ad0")]
    assert replicas and len(replicas) == len(set(replicas)), replicas  # one plane load per replica
    grew = {u: engine_loads(p, u) - before[u] for u in p.sim_urls}
    assert all(n <= 1 for n in grew.values()) and sum(grew.values()) >= 1, grew  # and one engine load


def test_sglang_replicas_never_list_more_than_max_adapters_under_concurrent_loads(cluster: Platform) -> None:
    p = cluster
    if p.engine != "sglang":
        pytest.skip("only SGLang lists what it holds (exact residency)")
    most = dict.fromkeys(p.sim_urls, 0)
    stop = threading.Event()

    def watch() -> None:
        with httpx.Client(timeout=2.0) as c:
            while not stop.is_set():
                for u in p.sim_urls:
                    try:
                        cards = c.get(f"{u}/v1/models").json()["data"]
                    except httpx.HTTPError:
                        continue
                    most[u] = max(most[u], sum(1 for m in cards if m.get("parent")))
                time.sleep(0.03)

    t = threading.Thread(target=watch, daemon=True)
    t.start()
    try:
        models = [f"demo-base:ad{i}" for i in range(1, 8)] * 2
        urls = [p.gateway_urls[i % 3] for i in range(len(models))]
        with ThreadPoolExecutor(6) as pool:
            answers = list(
                pool.map(lambda um: chat(um[0], p.keys["acme"], um[1]), zip(urls, models, strict=True))
            )
        assert all(r.status_code == 200 for r in answers), [r.text for r in answers if r.status_code != 200]
    finally:
        stop.set()
        t.join(5)
    assert all(n <= MAX_ADAPTERS for n in most.values()), most
    # the plane made the room: SGLang never had to unload by its own LRU (--max-loaded-loras)
    lru = [httpx.get(f"{u}/_sim/engine", timeout=5).json()["lru_unloads"] for u in p.sim_urls]
    assert lru == [0] * len(p.sim_urls), lru
