"""The routing table's safety net and its age (real PostgreSQL, LISTEN/NOTIFY): while nothing
changes it reads only the registry's revision, never the whole table; a change whose notice
never came is found by that read within a safety-net period and reloaded;
``loraplane_snapshot_age_seconds`` on the gateway's /metrics grows while the registry database
refuses connections and drops back once it is reachable again; a whole load on the event
loop is built in slices that let other tasks run, and equals the blocking load; and a gateway's
table freezes the objects alive after its first load out of the cyclic collector, once."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import psycopg
import pytest
from sqlalchemy import Engine

from gateway.api import create_gateway_app
from gateway.build import build_gateway, snapshot_applier, snapshot_loader
from gateway.settings import GatewaySettings
from gateway.table import RoutingTable
from kit import localservices as ls
from kit.db import make_engine, make_session_factory
from registry import migrate
from registry.feed import PostgresNotifyFeed, libpq_dsn
from registry.repositories.routing import all_rows_pg_text
from registry.services import lifecycle
from registry.services.snapshot import SLICE_ROWS, load_snapshot_pg_async, snapshot_from_json

from .gw_fakes import FakeRouter, make_snapshot
from .test_gw_table_apply import Counted, full, seed, wait_revision, write

REFRESH_S = 0.4


@pytest.fixture
def pg_db() -> Iterator[str]:
    with ls.temp_pg_database("gwfresh") as url:
        migrate.upgrade(url)
        yield url


@pytest.fixture
def engine(pg_db: str) -> Iterator[Engine]:
    eng = make_engine(pg_db)
    yield eng
    eng.dispose()


@contextlib.asynccontextmanager
async def _table(engine: Engine, url: str, channel: str, **kw: Any) -> AsyncIterator[RoutingTable]:
    table = RoutingTable(
        Counted(engine),
        feed=PostgresNotifyFeed(url, channel=channel),
        apply_changes=snapshot_applier(engine),
        refresh_s=REFRESH_S,
        verify_s=600,
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


async def test_idle_safety_net_reads_the_revision_and_finds_a_missed_notice(
    engine: Engine, pg_db: str
) -> None:
    channel = "lp_fresh_missed"
    factory = make_session_factory(engine)
    seed(factory, "miss", 4)
    async with _table(engine, pg_db, channel) as table:
        loader = table._loader
        assert isinstance(loader, Counted)
        # idle: revision reads only, no whole load, and each keeps the table's age low
        async with asyncio.timeout(10):
            while table.revision_checks < 3:
                await asyncio.sleep(0.05)
        assert loader.calls == 1 and table.refreshes == 0 and table.missed == 0
        assert table.age_s() < REFRESH_S + 1.0  # confirmed by the last check (busy machine: slack)

        # a change whose notice never comes (no channel bound), and nothing after it
        t0 = time.monotonic()
        write(factory, None, lambda s: lifecycle.promote(s, "miss-2", "v2", actor="t"))
        await wait_revision(table, factory)
        took = time.monotonic() - t0
        # found by the next check: one period, the notice grace (min(1 s, refresh_s)), one load
        assert took < REFRESH_S + REFRESH_S + 3.0, took
        assert (table.missed, table.gaps, loader.calls) == (1, 0, 2)
        snap = table.snapshot
        assert snap is not None and snap.adapters["miss-2"].active_version == "v2"
        assert snap == full(factory)

        # announced changes are applied incrementally and never count as missed
        write(factory, channel, lambda s: lifecycle.rollback(s, "miss-2", actor="t"))
        await wait_revision(table, factory)
        checks = table.revision_checks
        async with asyncio.timeout(10):
            while table.revision_checks < checks + 2:
                await asyncio.sleep(0.05)
        assert (table.missed, table.applies, loader.calls) == (1, 1, 2)
        assert table.snapshot == full(factory)


def _set_connections(url: str, allow: bool) -> None:
    """Let clients connect to the test database or refuse them (and drop the ones it has)."""
    name = url.rsplit("/", 1)[1]
    base = ls.pg_server_url().replace("postgresql+psycopg://", "postgresql://") + "/postgres"
    with psycopg.connect(base, autocommit=True) as conn:
        conn.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS {"true" if allow else "false"}')
        if not allow:
            conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s", (name,))


async def _scrape_age(client: httpx.AsyncClient) -> float:
    r = await client.get("/metrics")
    assert r.status_code == 200
    lines = [x for x in r.text.splitlines() if x.startswith("loraplane_snapshot_age_seconds ")]
    assert len(lines) == 1, r.text[:2000]
    return float(lines[0].split()[1])


async def test_snapshot_age_metric_grows_while_postgres_refuses_and_drops_after(
    engine: Engine, pg_db: str
) -> None:
    factory = make_session_factory(engine)
    seed(factory, "age", 2)
    settings = GatewaySettings(snapshot_refresh_s=REFRESH_S, snapshot_verify_s=600, redis_url=None)
    gw_engine = make_engine(pg_db)
    gw = build_gateway(
        settings,
        router=FakeRouter(),
        engine=gw_engine,
        feed=PostgresNotifyFeed(pg_db, channel="lp_fresh_age"),
    )
    app = create_gateway_app(gw, local=True)  # /metrics on this port, as under `loraplane up`
    await gw.start()
    client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw")
    try:
        async with asyncio.timeout(10):
            while gw.table.revision_checks < 2:
                await asyncio.sleep(0.05)
        assert await _scrape_age(client) < REFRESH_S + 1.0

        engine.dispose()
        _set_connections(pg_db, allow=False)
        try:
            async with asyncio.timeout(10):
                while not gw.table.stale:  # the next revision read fails
                    await asyncio.sleep(0.05)
            first = await _scrape_age(client)
            await asyncio.sleep(1.5)
            later = await _scrape_age(client)
            assert later >= first + 1.2 and later > 1.5, (first, later)
            assert gw.table.snapshot is not None  # still serving the last one
        finally:
            _set_connections(pg_db, allow=True)
        async with asyncio.timeout(15):
            while gw.table.stale:  # the retry (every ≤ 1 s) reloads it
                await asyncio.sleep(0.05)
        assert await _scrape_age(client) < 1.0
        # and revision reads keep it low while nothing changes
        checks = gw.table.revision_checks
        async with asyncio.timeout(10):
            while gw.table.revision_checks < checks + 3:
                await asyncio.sleep(0.05)
        assert await _scrape_age(client) < REFRESH_S + 1.0
    finally:
        await client.aclose()
        await gw.stop()
        gw_engine.dispose()
        gc.unfreeze()  # build_gateway's table froze this test process after its first load


async def test_whole_load_on_the_loop_is_built_in_slices_and_equals_the_blocking_load(
    engine: Engine, pg_db: str
) -> None:
    factory = make_session_factory(engine)
    seed(factory, "slice", SLICE_ROWS + 20)  # two slices of adapters
    write(factory, None, lambda s: lifecycle.promote(s, "slice-7", "v2", actor="t"))
    ticks = 0
    done = asyncio.Event()

    async def ticker() -> None:  # another task on the loop: counts its turns during the load
        nonlocal ticks
        while not done.is_set():
            ticks += 1
            await asyncio.sleep(0)

    async with await psycopg.AsyncConnection.connect(libpq_dsn(pg_db), autocommit=True) as conn:
        revision, texts = await all_rows_pg_text(conn)  # the round trip (the loop is free meanwhile)
        task = asyncio.create_task(ticker())
        await asyncio.sleep(0)
        before = ticks
        snap = await snapshot_from_json(revision, texts, slice_s=0.0)  # yield after every slice
        during = ticks - before
        done.set()
        await task
        # 7 tables parsed, versions grouped, 2 slices of adapters, 1 of tenants (no keys)
        assert during >= 11, during
        assert await load_snapshot_pg_async(conn) == snap
    assert snap == full(factory) == snapshot_loader(engine)()
    assert snap.adapters["slice-7"].active_version == "v2" and len(snap.adapters) == SLICE_ROWS + 20


async def test_first_whole_load_freezes_the_objects_alive_once() -> None:
    snap, _ = make_snapshot()
    table = RoutingTable(lambda: snap, refresh_s=60, freeze_gc=True)
    gc.unfreeze()  # whatever an earlier test in this process froze
    assert gc.get_freeze_count() == 0
    try:
        await table.start()
        frozen = gc.get_freeze_count()
        assert frozen > 1000  # this process's modules and objects
        kept: list[list[int]] = [[] for _ in range(1000)]  # alive at the next load: never frozen
        assert await table.reload()
        assert gc.get_freeze_count() < frozen + len(kept)  # frozen ones may be freed meanwhile
    finally:
        await table.stop()
        gc.unfreeze()  # leave the test process as it was
    quiet = RoutingTable(lambda: snap, refresh_s=60)  # the default: never freezes
    try:
        await quiet.start()
        assert gc.get_freeze_count() == 0
    finally:
        await quiet.stop()
