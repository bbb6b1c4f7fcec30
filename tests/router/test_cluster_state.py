"""Cluster state rules (router.cluster), on the in-process store and on the real Redis.

Two ``RedisCluster`` objects with different pids stand for two gateway processes; a process
that dies without a goodbye is one whose heartbeat stops (its lease runs out).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
import redis.asyncio as aioredis

from router.cluster import ClusterState, LoadCaps, MemoryCluster, RedisCluster

URL = "http://10.0.0.1:8000"

Factory = Callable[..., Awaitable[RedisCluster]]


@pytest.fixture
async def redis_client(redis_url: str) -> AsyncIterator[aioredis.Redis]:
    client = aioredis.Redis.from_url(redis_url)
    yield client
    await client.aclose()


@pytest.fixture
async def procs(redis_client: aioredis.Redis, redis_prefix: str) -> AsyncIterator[Factory]:
    made: list[RedisCluster] = []

    async def make(pid: str, lease_s: float = 30.0, linger_s: float = 0.05) -> RedisCluster:
        c = RedisCluster(redis_client, redis_prefix, lease_s=lease_s, linger_s=linger_s, pid=pid)
        await c.start()
        made.append(c)
        return c

    yield make
    for c in made:
        await c.stop()


@pytest.fixture(params=["memory", "redis"])
async def one(request: pytest.FixtureRequest, procs: Factory) -> MemoryCluster | RedisCluster:
    if request.param == "memory":
        return MemoryCluster("solo")
    return await procs("solo")


async def fill(c: ClusterState, names: list[str], max_adapters: int = 3) -> None:
    for n in names:
        claim = await c.claim(URL, n, max_adapters, (), 0.0)
        assert claim.outcome == "reserved" and claim.evict == ()
        await c.set_state(URL, n, "resident")


async def test_claim_reserves_until_full_then_evicts_idle_candidates_in_order(one: ClusterState) -> None:
    await fill(one, ["a@v1-00000001", "b@v1-00000002", "c@v1-00000003"])
    again = await one.claim(URL, "a@v1-00000001", 3, (), 0.0)
    assert again.outcome == "present" and again.record is not None and again.record.state == "resident"
    assert (await one.claim(URL, "d@v1-00000004", 3, (), 0.0)).outcome == "full"
    assert await one.mark(URL, "b@v1-00000002")  # b busy: passed over
    got = await one.claim(URL, "d@v1-00000004", 3, ("b@v1-00000002", "c@v1-00000003", "a@v1-00000001"), 0.0)
    assert got.outcome == "reserved" and got.evict == ("c@v1-00000003",)
    rec = await one.record(URL, "c@v1-00000003")
    assert rec is not None and rec.state == "unloading"
    # the victim is unloading: a new request there is refused; its slot still counts until the
    # engine confirms (a, b, c unloading, d staging: a fifth needs two victims, only a is idle)
    assert not await one.mark(URL, "c@v1-00000003")
    assert (await one.claim(URL, "e@v1-00000005", 3, ("a@v1-00000001",), 0.0)).outcome == "full"
    await one.end_unload(URL, "c@v1-00000003", True)
    assert await one.record(URL, "c@v1-00000003") is None
    assert (await one.claim(URL, "e@v1-00000005", 3, ("a@v1-00000001",), 0.0)).evict == ("a@v1-00000001",)


async def test_unload_refused_while_marked_and_allowed_after(one: MemoryCluster | RedisCluster) -> None:
    await fill(one, ["a@v1-00000001"])
    assert await one.mark(URL, "a@v1-00000001")
    assert not await one.begin_unload(URL, "a@v1-00000001")
    one.unmark(URL, "a@v1-00000001")
    if isinstance(one, RedisCluster):
        await one.flush_marks(force=True)
    assert await one.begin_unload(URL, "a@v1-00000001")
    await one.end_unload(URL, "a@v1-00000001", False)  # the engine refused: resident again
    rec = await one.record(URL, "a@v1-00000001")
    assert rec is not None and rec.state == "resident"


async def test_failed_load_seen_by_later_claims_only_since_it_happened(one: ClusterState) -> None:
    assert (await one.claim(URL, "a@v1-00000001", 3, (), 0.0)).outcome == "reserved"
    await one.set_state(URL, "a@v1-00000001", "failed", failure="rejected", retry_elsewhere=False, reason="x")
    seen = await one.claim(URL, "a@v1-00000001", 3, (), 0.0)
    assert seen.outcome == "failed" and seen.record is not None
    assert seen.record.failure == "rejected" and seen.record.retry_elsewhere is False
    assert (await one.claim(URL, "a@v1-00000001", 3, (), 1e12)).outcome == "reserved"


async def test_sync_models_adopts_listed_and_drops_vanished(one: ClusterState) -> None:
    await fill(one, ["a@v1-00000001"])
    await asyncio.sleep(0.01)
    import time

    await one.sync_models(URL, ["b@v1-00000002"], time.time())
    assert await one.record(URL, "a@v1-00000001") is None
    rec = await one.record(URL, "b@v1-00000002")
    assert rec is not None and rec.state == "resident"


async def test_a_listing_asked_before_an_unload_does_not_bring_the_record_back(one: ClusterState) -> None:
    """The soak's phantom residents: ``sync_models`` with an answer asked before the unload must
    not re-add the record; one asked after the unload that lists it does."""
    import time

    await fill(one, ["x@v1-00000001"])
    asked = time.time()  # the poll asks /v1/models: the replica still lists x
    await asyncio.sleep(0.01)
    assert await one.begin_unload(URL, "x@v1-00000001")  # this process evicts x meanwhile
    await one.end_unload(URL, "x@v1-00000001", True)
    await one.sync_models(URL, ["x@v1-00000001"], asked)  # the older answer arrives
    assert await one.record(URL, "x@v1-00000001") is None
    await asyncio.sleep(0.01)
    await one.sync_models(URL, ["x@v1-00000001"], time.time())  # asked after: it is there
    rec = await one.record(URL, "x@v1-00000001")
    assert rec is not None and rec.state == "resident"


async def test_two_processes_see_each_others_marks_and_one_load(procs: Factory) -> None:
    a, b = await procs("gw-a"), await procs("gw-b")
    claims = await asyncio.gather(*(c.claim(URL, "x@v1-00000001", 3, (), 0.0) for c in (a, b, a, b)))
    assert sorted(c.outcome for c in claims) == ["present", "present", "present", "reserved"]
    await a.set_state(URL, "x@v1-00000001", "resident")
    assert await a.mark(URL, "x@v1-00000001")
    assert not await b.begin_unload(URL, "x@v1-00000001")  # a's request is in flight
    shares = await b.read([URL])
    assert shares is not None and shares[URL].remote_marks == {"x@v1-00000001": 1}
    assert shares[URL].records["x@v1-00000001"].state == "resident"
    a.unmark(URL, "x@v1-00000001")
    await a.flush_marks(force=True)
    assert await b.begin_unload(URL, "x@v1-00000001")
    assert not await a.mark(URL, "x@v1-00000001")  # being unloaded by b


async def test_dead_process_marks_and_loads_expire_with_its_lease(procs: Factory) -> None:
    dead, live = await procs("gw-dead", lease_s=0.4), await procs("gw-live")
    await fill(live, ["a@v1-00000001"])
    assert await dead.mark(URL, "a@v1-00000001")
    assert (await dead.claim(URL, "s@v1-00000002", 3, (), 0.0)).outcome == "reserved"  # staging
    for t in dead._tasks:  # it dies: no goodbye, no more heartbeats
        t.cancel()
    assert not await live.begin_unload(URL, "a@v1-00000001")
    assert (await live.claim(URL, "s@v1-00000002", 3, (), 0.0)).outcome == "present"
    await asyncio.sleep(0.6)
    assert await live.begin_unload(URL, "a@v1-00000001")
    assert (await live.claim(URL, "s@v1-00000002", 3, (), 0.0)).outcome == "reserved"


async def test_one_leader_per_chore_until_it_stops(procs: Factory) -> None:
    a, b = await procs("gw-a"), await procs("gw-b")
    assert await a.lead("hot") and not await b.lead("hot") and await a.lead("hot")
    await a.stop()
    assert await b.lead("hot")


async def test_redis_down_falls_back_to_local_rules_and_recovers(
    redis_client: aioredis.Redis, redis_prefix: str
) -> None:
    dead = aioredis.ConnectionPool(host="127.0.0.1", port=1, socket_connect_timeout=0.2)
    client = aioredis.Redis(connection_pool=dead)
    c = RedisCluster(client, redis_prefix, lease_s=0.3, pid="gw-x")  # heartbeat every 0.1 s
    await c.start()
    try:
        assert not c.shared
        assert (await c.claim(URL, "a@v1-00000001", 1, (), 0.0)).outcome == "reserved"
        assert (await c.claim(URL, "a@v1-00000001", 1, (), 0.0)).outcome == "present"
        assert await c.lead("hot")
        client.connection_pool = redis_client.connection_pool  # Redis is back
        for _ in range(50):  # the heartbeat notices by itself
            if c.shared:
                break
            await asyncio.sleep(0.05)
        assert c.shared
    finally:
        await c.stop()
        await dead.disconnect()


async def test_load_caps_per_replica_and_per_pool(one: MemoryCluster | RedisCluster) -> None:
    caps = LoadCaps(per_replica=1, per_pool=2, pool="main")
    other, third = "http://10.0.0.2:8000", "http://10.0.0.3:8000"
    assert (await one.claim(URL, "a@v1-00000001", 8, (), 0.0, caps)).outcome == "reserved"
    busy = await one.claim(URL, "b@v1-00000002", 8, (), 0.0, caps)
    assert busy.outcome == "busy" and busy.busy == "replica"  # one load at a time on URL
    assert (await one.claim(other, "b@v1-00000002", 8, (), 0.0, caps)).outcome == "reserved"
    busy = await one.claim(third, "c@v1-00000003", 8, (), 0.0, caps)
    assert busy.outcome == "busy" and busy.busy == "pool"  # two loads in flight in the pool
    await one.set_state(URL, "a@v1-00000001", "resident")  # a's load is over: room again
    assert (await one.claim(third, "c@v1-00000003", 8, (), 0.0, caps)).outcome == "reserved"
    await one.drop(other, "b@v1-00000002")  # an aborted load frees its place too
    assert (await one.claim(URL, "d@v1-00000004", 8, (), 0.0, caps)).outcome == "reserved"


async def test_processes_take_turns_at_a_replicas_load_slot(procs: Factory) -> None:
    """At a replica's cap of loads in flight, a process that waits there is registered; once the
    slot frees, the process that claimed it last yields the next one while the other waits (its
    own queue cannot take every slot its loads free), and claims again once nobody else waits."""
    a, b = await procs("gw-a"), await procs("gw-b")
    caps = LoadCaps(per_replica=1, pool="main", turn_ttl_s=0.4)
    assert (await a.claim(URL, "a1@v1-00000001", 8, (), 0.0, caps)).outcome == "reserved"
    busy = await b.claim(URL, "b1@v1-00000002", 8, (), 0.0, caps)
    assert busy.outcome == "busy" and busy.busy == "replica"  # b waits: registered
    await a.set_state(URL, "a1@v1-00000001", "resident")  # a's load is over: the slot is free
    turn = await a.claim(URL, "a2@v1-00000003", 8, (), 0.0, caps)
    assert turn.outcome == "busy" and turn.busy == "turn"  # a claimed last and b waits: b's turn
    assert (await b.claim(URL, "b1@v1-00000002", 8, (), 0.0, caps)).outcome == "reserved"
    await b.set_state(URL, "b1@v1-00000002", "resident")
    # a waits now (its refused try registered it): b yields, a claims
    assert (await b.claim(URL, "b2@v1-00000004", 8, (), 0.0, caps)).busy == "turn"
    assert (await a.claim(URL, "a2@v1-00000003", 8, (), 0.0, caps)).outcome == "reserved"
    await a.set_state(URL, "a2@v1-00000003", "resident")
    await asyncio.sleep(0.5)  # b's registration lapsed (it stopped trying): a may claim again
    assert (await a.claim(URL, "a3@v1-00000005", 8, (), 0.0, caps)).outcome == "reserved"
    await a.set_state(URL, "a3@v1-00000005", "resident")
    # without turns (the default caps) the last claimer is never held back
    plain = LoadCaps(per_replica=1, pool="main")
    assert (await b.claim(URL, "b3@v1-00000006", 8, (), 0.0, caps)).outcome == "reserved"
    assert (await a.claim(URL, "a4@v1-00000007", 8, (), 0.0, caps)).busy == "replica"
    await b.set_state(URL, "b3@v1-00000006", "resident")
    assert (await b.claim(URL, "b4@v1-00000008", 8, (), 0.0, plain)).outcome == "reserved"


async def test_background_loads_yield_to_any_waiting_process_and_never_register(procs: Factory) -> None:
    """A prewarm or planned load (no request waits for it) takes a replica's slot only while no
    other process waits there, and its refused tries register nothing: a request never waits
    behind background work of another process."""
    a, b = await procs("gw-a"), await procs("gw-b")
    caps = LoadCaps(per_replica=1, pool="main", turn_ttl_s=0.4)
    bg = LoadCaps(per_replica=1, pool="main", turn_ttl_s=0.4, background=True)
    assert (await a.claim(URL, "r1@v1-00000001", 8, (), 0.0, caps)).outcome == "reserved"
    assert (await b.claim(URL, "r2@v1-00000002", 8, (), 0.0, bg)).busy == "replica"  # registers nothing
    await a.set_state(URL, "r1@v1-00000001", "resident")
    assert (await a.claim(URL, "r3@v1-00000003", 8, (), 0.0, caps)).outcome == "reserved"  # nobody waits
    assert (await b.claim(URL, "r4@v1-00000004", 8, (), 0.0, caps)).busy == "replica"  # a request waits
    await a.set_state(URL, "r3@v1-00000003", "resident")
    assert (await a.claim(URL, "r5@v1-00000005", 8, (), 0.0, bg)).busy == "turn"  # b's request first
    assert (await b.claim(URL, "r4@v1-00000004", 8, (), 0.0, caps)).outcome == "reserved"
