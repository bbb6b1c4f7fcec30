"""Hot adapters against real simulators (SPEC §8 "Adapters marked hot (or measured hot) are
prewarmed"): a marked-hot adapter is loaded on ``hot_prewarm_replicas`` replicas without any
traffic, kept there, follows promotion, and stops being prewarmed when unmarked; other traffic
prefers evicting something else; hot adapters never evict each other; the measured-hot path."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path

import pytest

from registry.audit_sink import MemoryAuditSink
from registry.snapshot import VersionInfo
from router.core import Router
from tests.router.conftest import RouterFactory
from tests.router.routerkit import Sim, chat, put_version, snapshot_of, wait_until

pytestmark = pytest.mark.xdist_group("router-sims")


def copies(v: VersionInfo, sims: list[Sim]) -> int:
    return sum(v.lora_name in s.loaded() for s in sims)


def loaded_events(audit: MemoryAuditSink, adapter_id: str) -> list[dict[str, object]]:
    return [e for e in audit.events if e["action"] == "adapter.loaded" and e["subject_id"] == adapter_id]


async def settle(router: Router, passes: int = 4) -> None:
    """Let the reconciler run a few passes."""
    await asyncio.sleep(router.settings.reconcile_interval_s * passes)


async def test_marked_hot_adapter_is_prewarmed_without_traffic(
    sims: list[Sim], make_router: RouterFactory, artifacts, audit: MemoryAuditSink, tmp_path: Path
) -> None:
    hot = put_version(artifacts, tmp_path, "hot-bot", seed=80)
    plain = put_version(artifacts, tmp_path, "plain-bot", seed=81)
    off = put_version(artifacts, tmp_path, "off-bot", seed=82)  # marked hot but disabled
    router = await make_router([s.url for s in sims], hot_prewarm_replicas=2)
    router.update_snapshot(snapshot_of(hot, plain, off, hot=("hot-bot", "off-bot"), disabled=("off-bot",)))
    await wait_until(lambda: copies(hot, sims) == 2, timeout=20)
    await settle(router)
    assert copies(hot, sims) == 2  # exactly hot_prewarm_replicas, not every replica
    assert copies(plain, sims) == 0 and copies(off, sims) == 0
    await wait_until(lambda: len(loaded_events(audit, "hot-bot")) == 2, timeout=5)

    # a copy goes away (evicted, replica restarted …): the reconciler prewarms it again
    holder = next(r for r in router.store.replicas.values() if hot.lora_name in r.residents)
    assert await router.unloader.unload(holder, hot.lora_name, "evict")
    await wait_until(lambda: copies(hot, sims) == 2, timeout=20)

    # unmarked: no forced unload, but no prewarm any more either
    router.update_snapshot(snapshot_of(hot, plain, off, revision=2, disabled=("off-bot",)))
    await settle(router)
    assert copies(hot, sims) == 2
    holder = next(r for r in router.store.replicas.values() if hot.lora_name in r.residents)
    assert await router.unloader.unload(holder, hot.lora_name, "evict")
    await settle(router)
    assert copies(hot, sims) == 1


async def test_marked_hot_follows_the_active_version(
    sims: list[Sim], make_router: RouterFactory, artifacts, tmp_path: Path
) -> None:
    v1 = put_version(artifacts, tmp_path, "moving", "v1", seed=83)
    router = await make_router([s.url for s in sims], hot_prewarm_replicas=2, retired_idle_unload_s=0.5)
    router.update_snapshot(snapshot_of(v1, hot=("moving",)))
    await wait_until(lambda: copies(v1, sims) == 2, timeout=20)
    v2 = put_version(artifacts, tmp_path, "moving", "v2", seed=84)
    retired = dataclasses.replace(v1, status="retired")
    router.update_snapshot(snapshot_of(retired, v2, revision=2, hot=("moving",)))
    await wait_until(lambda: copies(v2, sims) == 2, timeout=20)
    await wait_until(lambda: copies(v1, sims) == 0, timeout=20)  # the retired one goes when idle
    await settle(router)
    assert copies(v2, sims) == 2


async def test_marked_hot_copies_are_capped_by_healthy_replicas(
    sims: list[Sim], make_router: RouterFactory, artifacts, tmp_path: Path
) -> None:
    v = put_version(artifacts, tmp_path, "capped", seed=89)
    two = sims[:2]
    router = await make_router([s.url for s in two], hot_prewarm_replicas=5)
    router.update_snapshot(snapshot_of(v, hot=("capped",)))
    await wait_until(lambda: copies(v, two) == 2, timeout=20)
    await settle(router)
    assert copies(v, sims) == 2  # min(5, two healthy replicas); the third is not in the pool


async def test_other_traffic_prefers_evicting_a_cold_adapter(
    sims: list[Sim], make_router: RouterFactory, artifacts, audit: MemoryAuditSink, tmp_path: Path
) -> None:
    hot = put_version(artifacts, tmp_path, "keep-warm", seed=85)
    cold = [put_version(artifacts, tmp_path, f"cold-{i}", seed=86 + i) for i in range(4)]
    two = sims[:2]
    router = await make_router([s.url for s in two], max_loras=2, max_adapters=2, hot_prewarm_replicas=2)
    router.update_snapshot(snapshot_of(hot, *cold, hot=("keep-warm",)))
    await wait_until(lambda: copies(hot, two) == 2, timeout=20)
    # one free slot per replica: from the third cold adapter on, every load evicts something;
    # the hot adapter's copies are the least recently used, yet the cold ones go
    for v in cold:
        res = await router.forward(chat(v))
        assert res.status == 200
        assert copies(hot, two) == 2
    evicted = [e["subject_id"] for e in audit.events if e["action"] == "adapter.unloaded"]
    assert evicted and "keep-warm" not in evicted
    assert all(len(s.loaded()) <= 2 for s in two)


async def test_hot_adapters_never_evict_each_other(
    sims: list[Sim], make_router: RouterFactory, artifacts, audit: MemoryAuditSink, tmp_path: Path
) -> None:
    hots = [put_version(artifacts, tmp_path, f"crowd-{i}", seed=90 + i) for i in range(3)]
    two = sims[:2]
    router = await make_router([s.url for s in two], max_loras=2, max_adapters=2, hot_prewarm_replicas=2)
    router.update_snapshot(snapshot_of(*hots, hot=tuple(h.adapter_id for h in hots)))
    # four slots for six wanted copies: they fill up and stay put, with no churn
    await wait_until(lambda: sum(copies(h, two) for h in hots) == 4, timeout=20)
    await settle(router, passes=6)
    assert sum(copies(h, two) for h in hots) == 4
    assert all(len(s.loaded()) == 2 for s in two)
    assert not [e for e in audit.events if e["action"] == "adapter.unloaded"]


async def test_measured_hot_adapter_is_replicated(
    sims: list[Sim], make_router: RouterFactory, artifacts, tmp_path: Path
) -> None:
    busy = put_version(artifacts, tmp_path, "busy-bot", seed=95)
    quiet = put_version(artifacts, tmp_path, "quiet-bot", seed=96)
    router = await make_router(
        [s.url for s in sims], hot_prewarm_rps=5.0, hot_prewarm_replicas=2, rate_window_s=0.5
    )
    router.update_snapshot(snapshot_of(busy, quiet))
    assert (await router.forward(chat(quiet))).status == 200  # one request: not hot
    for i in range(30):
        assert (await router.forward(chat(busy, request_id=f"b{i}"))).status == 200
    await wait_until(lambda: copies(busy, sims) == 2, timeout=20)
    await settle(router)
    assert copies(busy, sims) == 2 and copies(quiet, sims) == 1
