"""The replica directories serve the published placement plan (``ReplicaDirectory.plan``): in
process from the router's board, across processes from Redis (real Redis), joined with the replica
records into what operators read — demand, planned replicas, where each adapter is now."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import orjson
import pytest
import redis.asyncio as aioredis

from kit import localservices as ls
from kit.errors import Unavailable
from router.cluster import MemoryBoard, RedisBoard
from router.directory import LocalReplicaDirectory, RedisReplicaDirectory, plan_view, publish_records
from router.placement.plan import Demand, Plan, PlanParams, make_plan
from router.placement.table import ReplicaTable
from tests.router.conftest import RouterFactory
from tests.router.routerkit import Sim, chat, put_version, snapshot_of, wait_until
from tests.router.test_placement_support import res, view

R0, R1, R2 = "http://r0:8000", "http://r1:8000", "http://r2:8000"


def _records() -> list[dict[str, Any]]:
    def rec(url: str, *adapters: tuple[str, str]) -> dict[str, Any]:
        return {
            "url": url,
            "pool": "sim",
            "base_model": "base",
            "healthy": True,
            "adapters": [
                {"adapter": n.split("@")[0], "version": "v1", "lora_name": n, "state": st}
                for n, st in adapters
            ],
            "running": 0,
            "waiting": 0,
            "last_seen": None,
        }

    return [rec(R0, ("busy@v1", "resident")), rec(R1, ("calm@v1", "loading")), rec(R2, ("old@v1", "failed"))]


def _plan(now: float) -> Plan:
    """A real plan (``make_plan``) over three replicas: busy needs 3 copies, calm 1."""
    table = ReplicaTable()
    table.put(view(R0, res("busy@v1"), max_adapters=8, max_loras=4))
    table.put(view(R1, res("calm@v1", state="loading"), max_adapters=8, max_loras=4))
    table.put(view(R2, max_adapters=8, max_loras=4))
    demands = [
        Demand("busy@v1", "busy", "v1", "base", 12.5, inflight=60),
        Demand("calm@v1", "calm", "v1", "base", 0.5, inflight=1),
    ]
    return make_plan({"base": table}, demands, None, PlanParams(copy_share=0.25), now)


class _Source:
    def __init__(self) -> None:
        self.records = _records()

    def replica_records(self) -> list[dict[str, Any]]:
        return self.records

    async def request_prewarm(self, adapter_id: str, version: str, replicas: int) -> dict[str, Any]:
        return {}


def _check(view_: dict[str, Any], plan: Plan) -> None:
    assert view_["published"] is True and view_["overflow"] == plan.overflow
    assert view_["desired_replicas"] == plan.desired and set(view_["desired_replicas"]) == {"p"}
    assert view_["age_s"] is not None and 0 <= view_["age_s"] < 60
    assert view_["at"].endswith("Z")
    rows = {r["lora_name"]: r for r in view_["adapters"]}
    assert [r["lora_name"] for r in view_["adapters"]] == ["busy@v1", "calm@v1"]  # busiest first
    busy, calm = rows["busy@v1"], rows["calm@v1"]
    assert (busy["adapter"], busy["version"], busy["demand_rps"]) == ("busy", "v1", 12.5)
    assert busy["planned_replicas"] == 3 and busy["targets"] == [R0, R1, R2]  # ceil(60 / 25)
    assert busy["current"] == [{"url": R0, "state": "resident"}]
    assert busy["missing"] == [R1, R2]
    assert calm["planned_replicas"] == 1 and calm["demand_rps"] == 0.5
    assert calm["current"] == [{"url": R1, "state": "loading"}]  # a failed copy is not "where it is"
    assert calm["missing"] == [u for u in calm["targets"] if u != R1]


def test_local_directory_reads_the_plan_from_its_board() -> None:
    async def go() -> None:
        board = MemoryBoard()
        directory = LocalReplicaDirectory(_Source(), board)
        none = await directory.plan()
        assert none["published"] is False and none["adapters"] == [] and none["desired_replicas"] == {}
        plan = _plan(time.time())
        await board.put_plan(orjson.dumps(plan.to_json()), 30.0)
        _check(await directory.plan(), plan)
        # no board (a router without a controller): no plan, not an error
        assert (await LocalReplicaDirectory(_Source()).plan())["published"] is False

    asyncio.run(go())


def test_an_unreadable_plan_document_is_reported_not_raised() -> None:
    out = plan_view(b'{"targets": 3}', _records(), time.time())
    assert out["published"] is False and out["problem"] == "the published plan is unreadable"
    assert plan_view(b"not json", [], time.time())["published"] is False


def test_redis_directory_reads_the_plan_the_leader_published(redis_url: str, redis_prefix: str) -> None:
    async def go() -> None:
        redis = aioredis.from_url(redis_url)
        try:
            directory = RedisReplicaDirectory(redis, redis_prefix)
            assert (await directory.plan())["published"] is False
            # a gateway publishes its replica records, the leader its plan on the board (expiring)
            await publish_records(redis, redis_prefix, _records(), ttl_s=5.0)
            plan = _plan(time.time())
            await RedisBoard(redis, redis_prefix).put_plan(orjson.dumps(plan.to_json()), 0.6)
            _check(await directory.plan(), plan)
            await asyncio.sleep(0.8)  # the leader stopped publishing: the plan expires
            assert (await directory.plan())["published"] is False
        finally:
            await redis.aclose()

    asyncio.run(go())


def test_redis_directory_unreachable_is_unavailable() -> None:
    async def go() -> None:
        redis = aioredis.from_url(f"redis://127.0.0.1:{ls.free_port()}", socket_connect_timeout=0.5)
        try:
            with pytest.raises(Unavailable) as err:
                await RedisReplicaDirectory(redis, "x:").plan()
            assert err.value.code == "replicas_unavailable"
        finally:
            await redis.aclose()

    asyncio.run(go())


@pytest.mark.xdist_group("router-sims")  # the session's simulators
async def test_a_routers_own_directory_serves_the_plan_its_controller_made(
    sims: list[Sim], make_router: RouterFactory, artifacts: Any, tmp_path: Path
) -> None:
    """``loraplane up``: the router's controller plans on its in-process board every 0.3 s; the
    directory the admin API gets (``Router.directory``) serves that plan with real residency."""
    busy = put_version(artifacts, tmp_path, "plan-bot", seed=90)
    quiet = put_version(artifacts, tmp_path, "quiet-bot", seed=91)
    router = await make_router([s.url for s in sims], plan_interval_s=0.3)
    router.update_snapshot(snapshot_of(busy, quiet))
    directory = router.directory
    got: dict[str, Any] = {}

    async def planned() -> bool:
        nonlocal got
        for i in range(3):
            await router.forward(chat(busy, request_id=f"plan-{i}"))
        got = await directory.plan()
        rows = [a for a in got["adapters"] if a["lora_name"] == busy.lora_name]
        return bool(rows and rows[0]["current"])

    await wait_until(planned, timeout=20, step=0.3)
    (row,) = [a for a in got["adapters"] if a["lora_name"] == busy.lora_name]
    assert got["published"] is True and got["desired_replicas"]["main"] >= 1
    assert row["adapter"] == "plan-bot" and row["demand_rps"] > 0 and row["planned_replicas"] >= 1
    assert set(row["targets"]) <= {s.url for s in sims}
    holders = {s.url for s in sims if busy.lora_name in s.loaded()}
    assert {c["url"] for c in row["current"] if c["state"] == "resident"} <= holders
    assert all(a["lora_name"] != quiet.lora_name for a in got["adapters"])  # no traffic: not planned
