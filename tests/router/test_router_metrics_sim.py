"""The router's metrics carry the values that happened (not only their names): loads and their
results, load seconds, unloads by reason, cold-start waits, placement outcomes — on a real
simulator, read back from the router's own Prometheus registry."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from router.contract import AdapterLoadFailed
from tests.router.conftest import RouterFactory
from tests.router.routerkit import Sim, chat, put_version, snapshot_of

pytestmark = pytest.mark.xdist_group("router-sims")


def value(reg: CollectorRegistry, name: str, **labels: str) -> float:
    got = reg.get_sample_value(name, labels)
    return 0.0 if got is None else got


async def test_router_metrics_count_what_happened(
    sims: list[Sim], make_router: RouterFactory, artifacts, tmp_path: Path
) -> None:
    a, b, c = (put_version(artifacts, tmp_path, name, seed=70 + i) for i, name in enumerate("abc"))
    url = sims[0].url
    router = await make_router([url], max_loras=2, max_adapters=2)
    reg = router.metrics.registry
    router.update_snapshot(snapshot_of(a, b, c))
    # a: one cold request (a load), then four hits
    await router.forward(chat(a))
    for _ in range(4):
        await router.forward(chat(a))
    assert (
        value(reg, "loraplane_adapter_loads_total", replica=url, adapter="a", version="v1", result="ok") == 1
    )
    assert value(reg, "loraplane_adapter_load_seconds_count", adapter="a", version="v1") == 1
    assert value(reg, "loraplane_adapter_load_seconds_sum", adapter="a", version="v1") > 0
    assert value(reg, "loraplane_cold_start_wait_seconds_count", adapter="a", version="v1") == 1
    assert value(reg, "loraplane_placement_total", outcome="load") == 1
    assert value(reg, "loraplane_placement_total", outcome="hit") == 4
    # b fills the replica; c needs room: b (idle, one request) costs less to lose than a (five)
    await router.forward(chat(b))
    await asyncio.sleep(0.01)
    await router.forward(chat(c))
    assert value(reg, "loraplane_placement_total", outcome="load") == 3
    assert value(reg, "loraplane_placement_total", outcome="evict") == 1
    assert (
        value(reg, "loraplane_adapter_unloads_total", replica=url, adapter="b", version="v1", reason="evict")
        == 1
    )
    assert b.lora_name not in sims[0].loaded() and a.lora_name in sims[0].loaded()
    # a failed load is counted by its result, and waits for it are observed too
    sims[0].faults(fail_loads=2, fail_load_status=404)
    with pytest.raises(AdapterLoadFailed):
        await router.forward(chat(b))
    assert (
        value(
            reg, "loraplane_adapter_loads_total", replica=url, adapter="b", version="v1", result="not_found"
        )
        == 1
    )
    assert value(reg, "loraplane_cold_start_wait_seconds_count", adapter="b", version="v1") == 2
    assert value(reg, "loraplane_replicas_healthy", pool="main") == 1


async def test_requests_are_counted_by_the_tier_their_adapter_came_from(
    sims: list[Sim], make_router: RouterFactory, artifacts, tmp_path: Path
) -> None:
    """``loraplane_adapter_tier``: a first request is a ``load``; with 2 GPU slots (the
    replica's --max-loras) and a host cache of 3 (the pool's ``max_cpu_loras``), after four
    loads the third most recent adapter comes from the CPU tier, the fourth from disk, and a
    repeat from the GPU."""
    vs = [put_version(artifacts, tmp_path, f"tier{i}", seed=90 + i) for i in range(4)]
    url = sims[0].url
    router = await make_router([url], max_loras=2, max_adapters=8, pool_fields={"max_cpu_loras": 3})
    reg = router.metrics.registry
    router.update_snapshot(snapshot_of(*vs))
    for v in vs:  # most recent last: tier3, tier2 on the GPU; tier1 in host memory; tier0 on disk
        assert (await router.forward(chat(v))).status == 200
        await asyncio.sleep(0.01)
    assert value(reg, "loraplane_adapter_tier_total", pool="main", tier="load") == 4
    await router.forward(chat(vs[1]))
    assert value(reg, "loraplane_adapter_tier_total", pool="main", tier="cpu") == 1
    await asyncio.sleep(0.01)
    await router.forward(chat(vs[0]))
    assert value(reg, "loraplane_adapter_tier_total", pool="main", tier="disk") == 1
    await router.forward(chat(vs[0]))
    assert value(reg, "loraplane_adapter_tier_total", pool="main", tier="gpu") == 1
