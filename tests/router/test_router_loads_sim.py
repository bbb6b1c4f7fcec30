"""Loads against real simulators and real Redis: singleflight across routers, eviction, hash
mismatch (local store and S3), load failures with failover, reconciler unloads, prewarm."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path

import pytest

from kit.localservices import S3Server
from kit.redis_factory import make_redis
from registry.audit_sink import MemoryAuditSink
from registry.storage.s3 import S3ArtifactStore
from router.contract import AdapterLoadFailed
from tests.router.conftest import RouterFactory
from tests.router.routerkit import Sim, chat, put_version, snapshot_of, wait_until

pytestmark = pytest.mark.xdist_group("router-sims")


def load_calls(sim: Sim) -> int:
    return int(sim.state()["load_calls"])


async def test_singleflight_across_router_processes_sharing_redis(
    sims: list[Sim], make_router: RouterFactory, artifacts, tmp_path: Path, redis_url: str, redis_prefix: str
) -> None:
    v = put_version(artifacts, tmp_path, "stampede", seed=11)
    urls = [sims[0].url, sims[1].url]
    clients = [make_redis(redis_url) for _ in range(3)]
    try:
        routers = [
            await make_router(urls, redis=c, redis_prefix=redis_prefix, load_timeout_s=20.0) for c in clients
        ]
        for r in routers:
            r.update_snapshot(snapshot_of(v))
        before = [load_calls(s) for s in sims[:2]]
        reqs = [routers[i % 3].forward(chat(v, request_id=f"r{i}")) for i in range(24)]
        results = await asyncio.gather(*reqs)
        assert all(r.status == 200 for r in results)
        served_by = {r.replica for r in results}
        deltas = [load_calls(s) - b for s, b in zip(sims[:2], before, strict=True)]
        # exactly one load per replica that serves it, never two
        for s, d in zip(sims[:2], deltas, strict=True):
            assert d == (1 if s.url in served_by else 0), (deltas, served_by)
            assert (v.lora_name in s.loaded()) == (s.url in served_by)
    finally:
        for c in clients:
            await c.aclose()


async def test_eviction_at_max_adapters(
    sims: list[Sim], make_router: RouterFactory, artifacts, audit: MemoryAuditSink, tmp_path: Path
) -> None:
    vs = [put_version(artifacts, tmp_path, f"ev{i}", seed=20 + i) for i in range(3)]
    router = await make_router([sims[0].url], max_loras=2, max_adapters=2)
    router.update_snapshot(snapshot_of(*vs))
    for v in vs:
        res = await router.forward(chat(v))
        assert res.status == 200
    loaded = sims[0].loaded()
    assert len(loaded) == 2
    assert vs[0].lora_name not in loaded  # the least recently used one went
    assert {vs[1].lora_name, vs[2].lora_name} == loaded
    unloads = [e for e in audit.events if e["action"] == "adapter.unloaded"]
    assert [e["subject_id"] for e in unloads] == ["ev0"]
    assert unloads[0]["details"]["reason"] == "evict"
    # staged files of the evicted version are cleaned up
    assert not (tmp_path / "staging" / vs[0].lora_name).exists()
    assert (tmp_path / "staging" / vs[2].lora_name).is_dir()


async def test_hash_mismatch_after_tampering_local_store(
    sims: list[Sim], make_router: RouterFactory, artifacts, audit: MemoryAuditSink, tmp_path: Path
) -> None:
    v = put_version(artifacts, tmp_path, "tampered", seed=30)
    weights = Path(v.storage_uri.removeprefix("file://")) / "adapter_model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF
    weights.write_bytes(bytes(data))
    router = await make_router([sims[0].url, sims[1].url])
    router.update_snapshot(snapshot_of(v))
    before = [load_calls(s) for s in sims[:2]]
    with pytest.raises(AdapterLoadFailed) as info:
        await router.forward(chat(v))
    assert info.value.status == 503 and info.value.retry_after
    assert [load_calls(s) for s in sims[:2]] == before  # nothing reached the engine
    ev = [e for e in audit.events if e["action"] == "adapter.hash_mismatch"]
    assert len(ev) == 1  # not retried elsewhere: the stored bytes are wrong everywhere
    d = ev[0]["details"]
    assert ev[0]["subject_type"] == "adapter" and ev[0]["subject_id"] == "tampered"
    assert d["version"] == "v1" and d["file"] == "adapter_model.safetensors"
    assert d["expected"] == v.files[1].sha256 and d["actual"] != d["expected"]
    assert not any(p.name.startswith(".tmp") for p in (tmp_path / "staging").iterdir())
    assert not (tmp_path / "staging" / v.lora_name).exists()


async def test_tampered_staged_copy_is_restaged_before_load(
    sims: list[Sim], make_router: RouterFactory, artifacts, tmp_path: Path
) -> None:
    v = put_version(artifacts, tmp_path, "restage", seed=31)
    router = await make_router([sims[0].url])
    router.update_snapshot(snapshot_of(v))
    await router.forward(chat(v))
    staged = tmp_path / "staging" / v.lora_name / "adapter_model.safetensors"
    good = staged.read_bytes()
    # evict it, corrupt the staged copy, load again: it is re-verified and re-staged
    await router.unloader.unload(router.store.replicas[sims[0].url], v.lora_name, "evict")
    staged.parent.mkdir(parents=True, exist_ok=True)
    (staged.parent / "adapter_config.json").write_text("{}")
    staged.write_bytes(b"garbage")
    res = await router.forward(chat(v))
    assert res.status == 200 and res.cold_load
    assert staged.read_bytes() == good


async def test_hash_mismatch_s3_store(
    sims: list[Sim], make_router: RouterFactory, audit: MemoryAuditSink, tmp_path: Path, s3_server: S3Server
) -> None:
    bucket = s3_server.create_bucket()
    client = s3_server.client()
    store = S3ArtifactStore(client, bucket, "lp/")
    try:
        good = put_version(store, tmp_path, "s3good", seed=40)
        bad = put_version(store, tmp_path, "s3bad", seed=41)
        key = bad.storage_uri.removeprefix(f"s3://{bucket}/") + "adapter_model.safetensors"
        client.put_object(Bucket=bucket, Key=key, Body=b"not the weights")
        router = await make_router([sims[0].url], store=store)
        router.update_snapshot(snapshot_of(good, bad))
        assert (await router.forward(chat(good))).status == 200
        with pytest.raises(AdapterLoadFailed):
            await router.forward(chat(bad))
        ev = [e for e in audit.events if e["action"] == "adapter.hash_mismatch"]
        assert [e["subject_id"] for e in ev] == ["s3bad"]
        assert bad.lora_name not in sims[0].loaded()
    finally:
        store.close()


async def test_load_failure_fails_over_to_another_replica(
    sims: list[Sim], make_router: RouterFactory, artifacts, audit: MemoryAuditSink, tmp_path: Path
) -> None:
    v = put_version(artifacts, tmp_path, "flaky", seed=50)
    # both replicas fail their next loads with 404 (not found; the staged copy is tried twice): the
    # router tries one, then the other
    sims[0].faults(fail_loads=2, fail_load_status=404)
    sims[1].faults(fail_loads=2, fail_load_status=404)
    router = await make_router([sims[0].url, sims[1].url])
    router.update_snapshot(snapshot_of(v))
    with pytest.raises(AdapterLoadFailed):
        await router.forward(chat(v))
    failed = [e for e in audit.events if e["action"] == "adapter.load_failed"]
    assert {e["details"]["replica"] for e in failed} == {sims[0].url, sims[1].url}
    assert all(e["details"]["reason"] == "not_found" for e in failed)
    # now only one replica fails: the request succeeds on the other one
    sims[0].faults(fail_loads=2, fail_load_status=404)
    res = await router.forward(chat(v))
    assert res.status == 200
    assert v.lora_name in {*sims[0].loaded(), *sims[1].loaded()}


async def test_rejected_adapter_is_retried_once_on_another_replica(
    sims: list[Sim], make_router: RouterFactory, artifacts, audit: MemoryAuditSink, tmp_path: Path
) -> None:
    v = put_version(artifacts, tmp_path, "rejected", seed=51)
    sims[0].faults(fail_loads=1, fail_load_status=500)
    sims[1].faults(fail_loads=1, fail_load_status=500)
    router = await make_router([sims[0].url, sims[1].url])
    router.update_snapshot(snapshot_of(v))
    before = load_calls(sims[0]) + load_calls(sims[1])
    with pytest.raises(AdapterLoadFailed):
        await router.forward(chat(v))
    assert load_calls(sims[0]) + load_calls(sims[1]) - before == 2  # one retry, never more
    failed = [e for e in audit.events if e["action"] == "adapter.load_failed"]
    assert len(failed) == 2 and {e["details"]["reason"] for e in failed} == {"rejected"}
    assert {e["details"]["replica"] for e in failed} == {sims[0].url, sims[1].url}


async def test_replica_refusing_every_load_is_ejected_and_fresh_adapters_load_elsewhere(
    sims: list[Sim], make_router: RouterFactory, artifacts, tmp_path: Path
) -> None:
    """Finding 1 of the fault run: one replica answering 500 to loads blocked every new adapter."""
    vs = [put_version(artifacts, tmp_path, f"fresh{i}", seed=300 + i) for i in range(12)]
    sims[0].faults(fail_loads=1000, fail_load_status=500)
    router = await make_router(
        [sims[0].url, sims[1].url, sims[2].url], max_adapters=8, outlier_failures=3, outlier_cooloff_s=60
    )
    router.update_snapshot(snapshot_of(*vs))
    before = load_calls(sims[0])
    answers = [await router.forward(chat(v)) for v in vs]
    assert [a.status for a in answers] == [200] * 12
    assert {a.replica for a in answers} <= {sims[1].url, sims[2].url}
    assert load_calls(sims[0]) - before <= 3  # ejected after three failures in a row
    assert not router.store.replicas[sims[0].url].healthy
    await asyncio.sleep(0.5)  # good health polls do not bring it back before its cool-off
    assert not router.store.replicas[sims[0].url].healthy


async def test_disabled_adapter_unloaded_and_retired_version_unloaded_when_idle(
    sims: list[Sim], make_router: RouterFactory, artifacts, audit: MemoryAuditSink, tmp_path: Path
) -> None:
    a = put_version(artifacts, tmp_path, "killme", seed=60)
    old = put_version(artifacts, tmp_path, "rolling", "v1", seed=61)
    router = await make_router([sims[0].url], retired_idle_unload_s=0.5, max_adapters=4)
    router.update_snapshot(snapshot_of(a, old))
    await router.forward(chat(a))
    await router.forward(chat(old))
    assert {a.lora_name, old.lora_name} <= sims[0].loaded()
    new = put_version(artifacts, tmp_path, "rolling", "v2", seed=62)
    retired = dataclasses.replace(old, status="retired")
    router.update_snapshot(snapshot_of(a, retired, new, revision=2, disabled=("killme",)))
    await wait_until(lambda: a.lora_name not in sims[0].loaded(), timeout=5)
    await wait_until(lambda: old.lora_name not in sims[0].loaded(), timeout=5)

    def reasons() -> dict[str, str]:
        return {
            e["subject_id"]: e["details"]["reason"] for e in audit.events if e["action"] == "adapter.unloaded"
        }

    # the audit row is written just after the replica answers the unload: wait for it too
    await wait_until(lambda: len(reasons()) == 2, timeout=5)
    assert reasons() == {"killme": "disabled", "rolling": "retired"}


async def test_prewarm_loads_onto_n_replicas(
    sims: list[Sim], make_router: RouterFactory, artifacts, tmp_path: Path, redis_url: str, redis_prefix: str
) -> None:
    from router.directory import RedisReplicaDirectory

    v = put_version(artifacts, tmp_path, "warm", seed=70)
    urls = [s.url for s in sims]
    redis = make_redis(redis_url)
    try:
        router = await make_router(urls, redis=redis, redis_prefix=redis_prefix, publish_interval_s=0.2)
        router.update_snapshot(snapshot_of(v))
        ack = await router.directory.request_prewarm("warm", "v1", 2)
        assert len(ack["replicas"]) == 2
        await wait_until(lambda: sum(v.lora_name in s.loaded() for s in sims) == 2, timeout=10)
        # the admin API in another process sees the replicas through Redis and can prewarm too
        directory = RedisReplicaDirectory(redis, redis_prefix)

        async def published() -> bool:
            recs = await directory.list_replicas()
            return sum(any(a["lora_name"] == v.lora_name for a in r["adapters"]) for r in recs) == 2

        await wait_until(published, timeout=10)
        recs = await directory.list_replicas()
        assert {r["url"] for r in recs} == set(urls)
        assert all(r["healthy"] and r["base_model"] == "demo-base" for r in recs)
        ack2 = await directory.request_prewarm("warm", "v1", 3)
        assert ack2["queued"] is True
        await wait_until(lambda: sum(v.lora_name in s.loaded() for s in sims) == 3, timeout=10)
    finally:
        await redis.aclose()


async def test_staged_files_stay_while_another_process_stages_the_same_version(
    sims: list[Sim], make_router: RouterFactory, artifacts, tmp_path: Path, redis_url: str, redis_prefix: str
) -> None:
    """The soak's lost staged files: process A unloads a version from one replica while process B
    (sharing the staging directory) is staging it for another; A must leave the files (the cluster's
    records say B needs them), and remove them once nobody does."""
    v = put_version(artifacts, tmp_path, "sharedfiles", seed=41)
    urls = [sims[0].url, sims[1].url]
    clients = [make_redis(redis_url) for _ in range(2)]
    try:
        a, b = [await make_router(urls, redis=c, redis_prefix=redis_prefix) for c in clients]
        a.update_snapshot(snapshot_of(v))
        b.update_snapshot(snapshot_of(v))
        res = await a.forward(chat(v))
        assert res.status == 200
        staged = tmp_path / "staging" / v.lora_name
        assert staged.is_dir()
        other = sims[1].url if res.replica == sims[0].url else sims[0].url
        await asyncio.sleep(1.0)  # the request's in-flight mark lapses
        claim = await b.cluster.claim(other, v.lora_name, 4, (), 0.0)  # B starts staging it there
        assert claim.outcome == "reserved"
        rep = a.store.replicas[res.replica]
        assert await a.unloader.unload(rep, v.lora_name, "evict")  # before A's view syncs B's claim
        assert v.lora_name not in sims[0].loaded() | sims[1].loaded()
        assert staged.is_dir(), "A removed files another process is staging"
        await b.cluster.drop(other, v.lora_name)  # B gave up: nobody needs them any more
        await wait_until(lambda: v.lora_name not in a.store.replicas[other].residents, 10)
        res2 = await a.forward(chat(v))
        assert res2.status == 200
        rep2 = a.store.replicas[res2.replica]
        await wait_until(lambda: a.unloader.unload(rep2, v.lora_name, "evict"), 10)
        assert not staged.exists()
    finally:
        for c in clients:
            await c.aclose()


async def test_a_load_with_every_adapter_in_use_waits_for_one_to_finish(
    sims: list[Sim], make_router: RouterFactory, artifacts, audit: MemoryAuditSink, tmp_path: Path
) -> None:
    """No room because every resident adapter is serving a request is transient: the request waits
    (bounded by load_timeout_s) for one to finish and evicts it, instead of a 503 at once."""
    busy, waiting = (put_version(artifacts, tmp_path, f"room{i}", seed=40 + i) for i in range(2))
    router = await make_router([sims[0].url], max_loras=1, max_adapters=1)
    router.update_snapshot(snapshot_of(busy, waiting))
    assert (await router.forward(chat(busy))).status == 200  # resident, idle
    sims[0].faults(stall_s=1.5)
    first = asyncio.create_task(router.forward(chat(busy)))
    await asyncio.sleep(0.5)  # busy's request is in flight on the only slot
    sims[0].faults(reset=True)
    second = await router.forward(chat(waiting))
    assert second.status == 200
    assert (await first).status == 200
    assert sims[0].loaded() == {waiting.lora_name}
    evicted = [e["subject_id"] for e in audit.events if e["action"] == "adapter.unloaded"]
    assert evicted == ["room0"]
