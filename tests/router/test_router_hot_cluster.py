"""The placement controller ahead of demand (issue 28.1), and issue 24.11 on real routers:
"measured hot" is counted cluster-wide (the demand board), not per
gateway process, and a pool's ``max_num_seqs`` (not a constant) is what placement divides by.

Two routers sharing Redis stand for two gateway processes; each routes an adapter at a rate
below ``hot_prewarm_rps``, the two together above it. Counted per process (as before the fix),
neither would call it hot; counted cluster-wide, the chore leader's forecast sees both routers'
requests and its plan keeps the adapter on ``hot_prewarm_replicas`` replicas, both of which then
hold it."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from kit.redis_factory import make_redis
from tests.router.conftest import RouterFactory
from tests.router.routerkit import Sim, chat, put_version, snapshot_of

pytestmark = pytest.mark.xdist_group("router-sims")

THRESHOLD = 6.0  # requests per second, cluster-wide
EACH = 4.0  # each router's rate: below the threshold alone, above it together


async def test_measured_hot_counts_every_gateways_requests(
    sims: list[Sim], make_router: RouterFactory, artifacts, tmp_path: Path, redis_url: str, redis_prefix: str
) -> None:
    v = put_version(artifacts, tmp_path, "warmish", seed=41)
    urls = [sims[0].url, sims[1].url]
    clients = [make_redis(redis_url) for _ in range(2)]
    try:
        routers = [
            await make_router(
                urls, redis=c, redis_prefix=redis_prefix, plan_interval_s=0.5,
                hot_prewarm_rps=THRESHOLD, hot_prewarm_replicas=2, pool_fields={"max_num_seqs": 64},
            )
            for c in clients
        ]  # fmt: skip
        for r in routers:
            r.update_snapshot(snapshot_of(v))
            assert all(rep.view().max_num_seqs == 64 for rep in r.store.replicas.values())

        async def send(r_index: int, stop: float) -> None:
            i = 0
            while time.monotonic() < stop:
                res = await routers[r_index].forward(chat(v, request_id=f"w{r_index}-{i}"))
                assert res.status == 200
                i += 1
                await asyncio.sleep(1.0 / EACH)

        stop = time.monotonic() + 8.0
        senders = [asyncio.create_task(send(i, stop)) for i in range(2)]
        planned: list[int] = []
        deadline = time.monotonic() + 8.0
        while time.monotonic() < deadline:
            await asyncio.sleep(0.25)
            leader = next((r for r in routers if r.controller is not None and r.controller.leading), None)
            plan = leader.controller.plan if leader is not None and leader.controller is not None else None
            if plan is not None and v.lora_name in plan.targets:
                planned.append(len(plan.targets[v.lora_name]))
                rate = plan.demand.get(v.lora_name, 0.0)
                if len(plan.targets[v.lora_name]) == 2 and rate > EACH:
                    break
        await asyncio.gather(*senders)
        assert planned and planned[-1] == 2, planned  # hot: kept on hot_prewarm_replicas replicas
        assert rate > EACH, rate  # the forecast saw both routers' requests, not one's
        held = [s for s in sims[:2] if v.lora_name in s.loaded()]
        deadline = time.monotonic() + 10.0
        while len(held) < 2 and time.monotonic() < deadline:  # the second copy, on the plan's target
            await asyncio.sleep(0.2)
            held = [s for s in sims[:2] if v.lora_name in s.loaded()]
        assert len(held) == 2
    finally:
        for c in clients:
            await c.aclose()


async def test_the_plan_loads_a_hot_adapter_before_any_request_for_it(
    sims: list[Sim], make_router: RouterFactory, artifacts, tmp_path: Path
) -> None:
    """The controller acts ahead of demand: an adapter marked hot gets its planned copies loaded
    by the plan's own actions (``loraplane_plan_actions_total{action="load"}``) on
    ``hot_prewarm_replicas`` replicas, and no request for it was ever sent."""
    v = put_version(artifacts, tmp_path, "ahead", seed=43)
    urls = [sims[0].url, sims[1].url]
    done_before = [s.state()["requests_done"] for s in sims[:2]]
    router = await make_router(urls, plan_interval_s=0.3, hot_prewarm_replicas=2)
    router.update_snapshot(snapshot_of(v, hot=("ahead",)))
    deadline = time.monotonic() + 15.0
    while sum(v.lora_name in s.loaded() for s in sims[:2]) < 2:
        assert time.monotonic() < deadline, [s.loaded() for s in sims[:2]]
        await asyncio.sleep(0.2)
    plan = router.controller.plan if router.controller is not None else None
    assert plan is not None and plan.targets[v.lora_name] == frozenset(urls)
    loads = router.metrics.registry.get_sample_value("loraplane_plan_actions_total", {"action": "load"})
    assert loads is not None and loads >= 2
    assert [s.state()["requests_done"] for s in sims[:2]] == done_before  # no request was served
