"""The routing table applies registry changes incrementally (real PostgreSQL, LISTEN/NOTIFY):
one adapter's change re-reads only that adapter, a missed revision reloads everything, a burst
of 1,000 changes is coalesced, after many random changes the table equals a full load, and the
safety-net reload neither holds up changes nor misses a table that went wrong."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import random
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy import Engine
from sqlalchemy.orm import Session, sessionmaker

from gateway.build import snapshot_applier, snapshot_loader
from gateway.snapshot_source import PostgresSnapshotLoader
from gateway.table import RoutingTable
from kit import localservices as ls
from kit.db import make_engine, make_session_factory, session_scope
from kit.errors import LoraplaneError
from registry import migrate
from registry.demo import demo_base_model
from registry.feed import (
    APPLICATION_NAME,
    InProcessFeed,
    PostgresNotifyFeed,
    bind_feed,
    publish_committed,
    read_revision,
)
from registry.repositories import base_models as base_repo
from registry.services import adapters as adapter_svc
from registry.services import lifecycle
from registry.services import owners as owner_svc
from registry.services import tenants as tenant_svc
from registry.services.base_models import create_base_model
from registry.services.snapshot import load_snapshot
from registry.services.versions import register_version
from registry.snapshot import RoutingSnapshot

Factory = sessionmaker[Session]


@pytest.fixture(scope="module")
def pg_db() -> Iterator[str]:
    with ls.temp_pg_database("gwapply") as url:
        migrate.upgrade(url)
        yield url


@pytest.fixture
def channel(request: pytest.FixtureRequest) -> str:
    return f"lp_apply_{request.node.name.replace('[', '_').replace(']', '')}"[:60]


@pytest.fixture
def engine(pg_db: str) -> Iterator[Engine]:
    eng = make_engine(pg_db)
    yield eng
    eng.dispose()


class Counted:
    """The real loader, counting whole loads."""

    def __init__(self, engine: Engine) -> None:
        self._load = snapshot_loader(engine)
        self.calls = 0

    def __call__(self) -> RoutingSnapshot:
        self.calls += 1
        return self._load()


@contextlib.asynccontextmanager
async def _table(engine: Engine, url: str, channel: str, **kw: Any) -> AsyncIterator[RoutingTable]:
    table = RoutingTable(
        Counted(engine),
        feed=PostgresNotifyFeed(url, channel=channel),
        apply_changes=snapshot_applier(engine),
        refresh_s=600,
        **kw,
    )
    await table.start()
    async with asyncio.timeout(10):
        while table.notified_at is None:  # LISTEN is established (the feed's first notice came)
            await asyncio.sleep(0.01)
    try:
        yield table
    finally:
        await table.stop()


def write(factory: Factory, channel: str | None, fn: Callable[[Session], Any]) -> None:
    """As the admin API writes: one transaction, the feed bound (no channel: nobody is told)."""
    with session_scope(factory) as s:
        if channel is not None:  # the feed object only names the channel here; it never connects
            bind_feed(s, PostgresNotifyFeed("postgresql://127.0.0.1/unused", channel=channel))
        fn(s)


def files(i: int) -> list[dict[str, Any]]:
    return [
        {"name": "adapter_config.json", "size": 10, "sha256": f"{i:064x}"},
        {"name": "adapter_model.safetensors", "size": 100, "sha256": f"{i + 1000:064x}"},
    ]


def seed(factory: Factory, prefix: str, adapters: int, versions: int = 2) -> None:
    def fn(s: Session) -> None:

        if base_repo.get(s, "demo-base") is None:
            create_base_model(s, demo_base_model(), actor="t")
        for a in range(adapters):
            aid = f"{prefix}-{a}"
            adapter_svc.create_adapter(
                s, adapter_id=aid, base_model="demo-base", owner="o", description=None, actor="t"
            )
            for v in range(versions):
                register_version(
                    s, aid, rank=8, lora_alpha=16.0, target_modules=["q_proj"], files=files(a * 10 + v),
                    storage_uri=f"file:///tmp/x/{aid}/{v}/", actor="t",
                )  # fmt: skip
            lifecycle.promote(s, aid, "v1", actor="t")
        tenant_svc.create_tenant(
            s, tenant_id=f"{prefix}-t", name=None, limits=None, base_model_access=True, actor="t"
        )

    write(factory, None, fn)


def full(factory: Factory) -> RoutingSnapshot:
    with session_scope(factory) as s:
        return load_snapshot(s)


async def wait_revision(table: RoutingTable, factory: Factory) -> None:
    rev = full(factory).revision
    await table.wait_for_revision(rev, timeout=15)


async def test_one_adapter_change_is_applied_without_a_full_reload(
    engine: Engine, pg_db: str, channel: str
) -> None:
    factory = make_session_factory(engine)
    seed(factory, "one", 20)
    async with _table(engine, pg_db, channel) as table:
        loader = table._loader
        assert isinstance(loader, Counted) and loader.calls == 1
        before = table.snapshot
        assert before is not None
        write(factory, channel, lambda s: lifecycle.promote(s, "one-3", "v2", actor="t"))
        await wait_revision(table, factory)
        after = table.snapshot
        assert after is not None and after.revision == before.revision + 1
        assert after.adapters["one-3"].active_version == "v2"
        assert loader.calls == 1 and table.reloads == 1  # no whole reload ...
        assert (table.applies, table.changes_applied, table.gaps) == (1, 1, 0)  # ... one incremental apply
        # everything else is the same objects (structural sharing), and equals a full load
        assert after.adapters["one-4"] is before.adapters["one-4"]
        assert after.tenants is before.tenants and after.keys_by_prefix is before.keys_by_prefix
        assert after == full(factory)
        # a tenant's key and grant changes reach the key index and the grants
        issued: list[str] = []

        def key(s: Session, issued: list[str] = issued) -> None:
            issued.append(tenant_svc.issue_key(s, "one-t", actor="t").key_id)
            tenant_svc.put_grant(s, "one-t", "one-3", rpm=5, tpm=None, actor="t")

        write(factory, channel, key)
        await wait_revision(table, factory)
        snap = table.snapshot
        assert snap is not None and snap.tenants["one-t"].grants["one-3"].rpm == 5
        assert [k.key_id for ks in snap.keys_by_prefix.values() for k in ks] == issued
        first = issued[0]
        write(factory, channel, lambda s: tenant_svc.revoke_key(s, "one-t", first, actor="t"))
        await wait_revision(table, factory)
        assert table.snapshot is not None and table.snapshot.keys_by_prefix == {}
        assert table.snapshot == full(factory) and loader.calls == 1


async def test_a_missed_revision_reloads_the_whole_table(engine: Engine, pg_db: str, channel: str) -> None:
    factory = make_session_factory(engine)
    seed(factory, "gap", 5)
    async with _table(engine, pg_db, channel) as table:
        assert table.reloads == 1
        # a change nobody is told about (no notify), then one the table hears of
        write(factory, None, lambda s: lifecycle.promote(s, "gap-1", "v2", actor="t"))
        write(factory, channel, lambda s: lifecycle.promote(s, "gap-2", "v2", actor="t"))
        await wait_revision(table, factory)
        assert table.gaps == 1 and table.reloads == 2 and table.applies == 0
        snap = table.snapshot
        assert snap is not None and snap.adapters["gap-1"].active_version == "v2"  # the unannounced one too
        assert snap == full(factory)
        # and changes after the reload are incremental again
        write(factory, channel, lambda s: lifecycle.rollback(s, "gap-1", actor="t"))
        await wait_revision(table, factory)
        assert (table.reloads, table.applies) == (2, 1)
        assert table.snapshot == full(factory)


async def test_a_burst_of_1000_changes_is_coalesced(engine: Engine, pg_db: str, channel: str) -> None:
    factory = make_session_factory(engine)
    seed(factory, "burst", 0)
    swaps: list[int] = []
    async with _table(engine, pg_db, channel, on_snapshot=lambda s: swaps.append(s.revision)) as table:
        base_rev = table.revision
        assert base_rev is not None

        def bulk(s: Session) -> None:  # 1,000 changes in one transaction, as a bulk operation makes
            for a in range(1000):
                adapter_svc.create_adapter(
                    s, adapter_id=f"burst-{a}", base_model="demo-base", owner="o", description=None, actor="t"
                )

        await asyncio.to_thread(write, factory, channel, bulk)
        await wait_revision(table, factory)
        assert table.revision == base_rev + 1000 and table.reloads == 1
        assert table.changes_applied == 1000
        assert table.applies <= 20, table.applies  # a few batched loads, not 1,000
        assert len(swaps) == table.applies + 1  # the first load's swap, then one per batch
        assert table.snapshot == full(factory)

        # 300 changes as fast as one writer commits them, one transaction each
        def one_by_one() -> None:
            for a in range(300):
                write(factory, channel, functools.partial(describe, f"burst-{a}"))

        def describe(adapter_id: str, s: Session) -> None:
            adapter_svc.update_adapter(s, adapter_id, {"description": "d2"}, actor="t")

        applies = table.applies
        t0 = time.monotonic()
        await asyncio.to_thread(one_by_one)
        took = time.monotonic() - t0
        await wait_revision(table, factory)
        assert table.reloads == 1 and table.changes_applied == 1300
        # at most one apply per batch window while the changes keep coming (plus the last one)
        assert table.applies - applies <= took / 0.02 + 2, (table.applies - applies, took)
        assert table.snapshot == full(factory)


async def test_served_state_after_random_changes_equals_a_full_reload(
    engine: Engine, pg_db: str, channel: str
) -> None:
    factory = make_session_factory(engine)
    seed(factory, "rnd", 6, versions=3)
    rng = random.Random(9)
    adapters = [f"rnd-{a}" for a in range(6)]
    tenants = ["rnd-t"]
    keys: dict[str, list[str]] = {"rnd-t": []}
    stop = threading.Event()

    def op(s: Session) -> None:
        kind = rng.randrange(14)
        a, t = rng.choice(adapters), rng.choice(tenants)
        if kind == 0:
            lifecycle.promote(s, a, f"v{rng.randint(1, 3)}", actor="t")
        elif kind == 1:
            lifecycle.promote(s, a, f"v{rng.randint(1, 3)}", canary_weight=rng.randint(1, 99), actor="t")
        elif kind == 2:
            lifecycle.rollback(s, a, actor="t")
        elif kind == 3:
            lifecycle.set_adapter_enabled(s, a, rng.random() < 0.6, actor="t")
        elif kind == 4:
            lifecycle.disable_version(s, a, f"v{rng.randint(1, 3)}", actor="t")
        elif kind == 5:
            adapter_svc.update_adapter(s, a, {"hot": rng.random() < 0.5}, actor="t")
        elif kind == 6:
            new = f"rnd-{len(adapters)}"
            adapter_svc.create_adapter(
                s, adapter_id=new, base_model="demo-base", owner=None, description=None, actor="t"
            )
            register_version(
                s, new, rank=4, lora_alpha=8.0, target_modules=["q_proj"], files=files(500 + len(adapters)),
                storage_uri=f"file:///tmp/x/{new}/", actor="t",
            )  # fmt: skip
            adapters.append(new)
        elif kind == 7:
            new = f"rnd-t{len(tenants)}"
            tenant_svc.create_tenant(
                s, tenant_id=new, name=None, limits={"rpm": 10}, base_model_access=False, actor="t"
            )
            tenants.append(new)
            keys[new] = []
        elif kind == 8:
            tenant_svc.update_tenant(s, t, {"limits": {"rpm": rng.randint(1, 100)}}, actor="t")
        elif kind == 9:
            keys[t].append(tenant_svc.issue_key(s, t, actor="t").key_id)
        elif kind == 10 and keys[t]:
            tenant_svc.revoke_key(s, t, keys[t].pop(rng.randrange(len(keys[t]))), actor="t")
        elif kind == 11:
            if rng.random() < 0.5:
                tenant_svc.put_grant(s, t, a, rpm=rng.randint(1, 9), tpm=None, actor="t")
            else:
                tenant_svc.delete_grant(s, t, a, actor="t")
        elif kind == 12:  # an adapter's limits and owner (the owner's name may hold a space)
            owner = rng.choice(["team a", "team-b"])
            adapter_svc.update_adapter(
                s, a, {"owner": owner, "limits": {"rpm": rng.randint(1, 50)}}, actor="t"
            )
        elif kind == 13:
            owner_svc.put_owner_limits(
                s, rng.choice(["team a", "team-b"]), {"tpm": rng.randint(100, 999)}, actor="t"
            )

    def writer() -> int:
        done = 0
        for _ in range(400):
            if stop.is_set():
                break
            try:
                write(factory, channel, op)
                done += 1
            except LoraplaneError:  # a refused change (409/404) leaves nothing behind
                pass
        return done

    async with _table(engine, pg_db, channel) as table:
        done = await asyncio.to_thread(writer)
        assert done > 100
        await wait_revision(table, factory)
        assert table.reloads == 1 and table.gaps == 0 and table.applies > 0
        snap = table.snapshot
        assert snap is not None and snap == full(factory)
        assert snapshot_loader(engine)() == snap  # the gateway's one-statement whole loads agree
        loader = PostgresSnapshotLoader(engine)
        assert await loader.load_async() == snap
        assert snap.owners and any(
            x.limits.rpm for x in snap.adapters.values()
        )  # owners and limits were changed


class Slow(Counted):
    """The real loader, slowed down after the first load (a large registry on a busy database)."""

    def __init__(self, engine: Engine, delay_s: float) -> None:
        super().__init__(engine)
        self.delay_s = delay_s
        self.started = threading.Event()

    def __call__(self) -> RoutingSnapshot:
        if self.calls:
            self.started.set()
            time.sleep(self.delay_s)
        return super().__call__()


async def test_the_safety_net_reload_does_not_hold_up_changes_and_repairs_drift(
    engine: Engine, pg_db: str, channel: str
) -> None:
    factory = make_session_factory(engine)
    seed(factory, "net", 3)
    loader = Slow(engine, delay_s=4.0)
    table = RoutingTable(
        loader,
        feed=PostgresNotifyFeed(pg_db, channel=channel),
        apply_changes=snapshot_applier(engine),
        refresh_s=0.3,
        verify_s=0.3,  # a whole load every time (revision checks alone never see drift)
    )
    await table.start()
    try:
        async with asyncio.timeout(10):
            while table.notified_at is None:
                await asyncio.sleep(0.01)
        await asyncio.to_thread(loader.started.wait, 10)  # a safety-net reload is under way ...
        t0 = time.monotonic()
        write(factory, channel, lambda s: lifecycle.promote(s, "net-1", "v2", actor="t"))
        await wait_revision(table, factory)
        assert time.monotonic() - t0 < 3.0  # ... and the change did not wait for it
        assert table.reloads == 1 and table.applies == 1
        # the reload that started before the change is older than the table: not installed
        async with asyncio.timeout(15):
            while loader.calls < 2:
                await asyncio.sleep(0.05)
        snap = table.snapshot
        assert snap is not None and snap.adapters["net-1"].active_version == "v2"
        # a table that went wrong at the same revision is found and replaced by the next reload
        loader.delay_s = 0.0
        broken = dataclasses.replace(snap, adapters={k: v for k, v in snap.adapters.items() if k != "net-2"})
        table.snapshot = broken
        async with asyncio.timeout(15):
            while table.drifts == 0:
                await asyncio.sleep(0.05)
        assert table.snapshot is not None and "net-2" in table.snapshot.adapters
        assert table.snapshot == full(factory)
    finally:
        await table.stop()


async def test_embedded_platform_applies_changes_from_the_in_process_feed(tmp_path: Path) -> None:
    """``loraplane up``: SQLite and the in-process feed; the same incremental path on a thread."""
    url = f"sqlite:///{tmp_path / 'registry.db'}"
    migrate.upgrade(url)
    eng = make_engine(url)
    factory = make_session_factory(eng)
    feed = InProcessFeed(initial_revision=lambda: read_revision(factory))
    try:
        seed(factory, "emb", 4)
        table = RoutingTable(Counted(eng), feed=feed, apply_changes=snapshot_applier(eng), refresh_s=600)
        await table.start()
        try:
            async with asyncio.timeout(10):
                while table.notified_at is None:  # the feed's listener is registered
                    await asyncio.sleep(0.01)
            for fn in (
                lambda s: lifecycle.promote(s, "emb-1", "v2", actor="t"),
                lambda s: tenant_svc.put_grant(s, "emb-t", "emb-2", rpm=3, tpm=None, actor="t"),
                lambda s: lifecycle.set_adapter_enabled(s, "emb-3", False, actor="t"),
            ):
                with session_scope(factory) as s:
                    bind_feed(s, feed)
                    fn(s)
                publish_committed(s, feed)  # as the admin API does after the commit
                await wait_revision(table, factory)
            assert (table.reloads, table.applies, table.gaps) == (1, 3, 0)
            assert table.snapshot == full(factory)
        finally:
            await table.stop()
    finally:
        eng.dispose()


async def test_a_feed_reconnect_reloads_the_whole_table(engine: Engine, pg_db: str, channel: str) -> None:
    factory = make_session_factory(engine)
    seed(factory, "rec", 3)
    async with _table(engine, pg_db, channel) as table:

        def drop_listener_then_change() -> None:
            with engine.begin() as conn:  # the gateway's LISTEN connection dies ...
                killed = conn.execute(
                    sa.text(
                        "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                        "WHERE application_name = :app AND datname = current_database()"
                    ),
                    {"app": APPLICATION_NAME},  # this module's database: only this table listens
                ).scalar()
            assert killed == 1
            # ... and a change commits while it is away (its notice reaches nobody)
            write(factory, channel, lambda s: lifecycle.promote(s, "rec-1", "v2", actor="t"))

        await asyncio.to_thread(drop_listener_then_change)
        await wait_revision(table, factory)  # the reconnect re-reads the revision: reload all
        assert table.reloads == 2 and table.applies == 0
        assert table.snapshot == full(factory)
        write(factory, channel, lambda s: lifecycle.rollback(s, "rec-1", actor="t"))
        await wait_revision(table, factory)  # and incremental again after it
        assert (table.reloads, table.applies) == (2, 1) and table.snapshot == full(factory)
