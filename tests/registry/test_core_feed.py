"""Change feed (in-process, polling, PostgreSQL LISTEN/NOTIFY with reconnect and latency),
routing snapshot contents and query count, DbAuditSink, bootstrap."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import sqlalchemy as sa
from sqlalchemy import event

from kit.db import make_engine, make_session_factory, session_scope
from registry.demo import demo_base_model
from registry.feed import (
    Change,
    InProcessFeed,
    PollingFeed,
    PostgresNotifyFeed,
    SqliteChangeProbe,
    make_feed,
)
from registry.keys import hash_key
from registry.repositories import state as state_repo
from registry.services import adapters as adapter_svc
from registry.services import lifecycle
from registry.services import tenants as tenant_svc
from registry.services.base_models import create_base_model
from registry.services.bootstrap import ensure_base_model
from registry.services.snapshot import current_revision, load_snapshot
from tests.registry.core_support import (
    AUTH,
    add_versions,
    make_settings,
)

log = logging.getLogger(__name__)


async def _change(it: Any, timeout: float = 5.0) -> Change:
    change = await asyncio.wait_for(it.__anext__(), timeout)
    assert isinstance(change, Change)
    return change


async def _next(it: Any, timeout: float = 5.0) -> int:
    return (await _change(it, timeout)).revision


async def test_in_process_feed_wakes_listeners_from_other_threads() -> None:
    feed = InProcessFeed()
    it = feed.listen()
    assert await _change(it) == Change(0, frozenset({"*"}))  # the start: what came before is unknown

    def publish_all() -> None:
        for r in (1, 2, 3):
            feed.publish(r, frozenset({f"adapter:a{r}"}))

    t = threading.Thread(target=publish_all)
    t.start()
    # every change, in order, with what it changed (a busy listener gets them from the history)
    got = [await _change(it) for _ in range(3)]
    assert got == [Change(r, frozenset({f"adapter:a{r}"})) for r in (1, 2, 3)]
    t.join(timeout=5)
    feed.publish(2)  # older revisions are ignored
    feed.publish(4, frozenset({"tenant:acme"}))
    assert await _change(it) == Change(4, frozenset({"tenant:acme"}))
    await it.aclose()


async def test_in_process_feed_listener_behind_its_history_sees_a_gap() -> None:
    feed = InProcessFeed(history=3)
    it = feed.listen()
    assert await _next(it) == 0
    for r in range(1, 8):
        feed.publish(r, frozenset({f"adapter:a{r}"}))
    # revisions 1-4 fell out of the history: the listener gets 5, 6, 7 and must notice the gap
    assert [await _next(it) for _ in range(3)] == [5, 6, 7]
    await it.aclose()


def test_notice_payload_round_trip() -> None:
    assert state_repo.notice_payload(7, ("tenant:b", "adapter:a")) == "7 adapter:a tenant:b"
    assert state_repo.parse_notice("7 adapter:a tenant:b") == (7, frozenset({"adapter:a", "tenant:b"}))
    assert state_repo.parse_notice("12") == (12, frozenset({"*"}))  # an older writer: reload everything
    spaced = state_repo.notice_payload(8, ("owner:team a%",))  # owner names may hold spaces
    assert spaced == "8 owner:team%20a%25" and state_repo.parse_notice(spaced) == (
        8,
        frozenset({"owner:team a%"}),
    )
    with pytest.raises(ValueError):
        state_repo.parse_notice("soon adapter:a")


async def test_polling_feed_sees_changes_from_another_engine(tmp_path: Path, sqlite_template: Path) -> None:
    import shutil

    db = tmp_path / "shared.db"
    shutil.copyfile(sqlite_template, db)
    url = f"sqlite:///{db}"
    reader, writer = make_engine(url), make_engine(url)  # as two processes would
    try:
        feed = PollingFeed(make_session_factory(reader), interval_s=0.02)
        it = feed.listen()
        assert await _next(it) == 0

        def change() -> None:
            with session_scope(make_session_factory(writer)) as s:
                create_base_model(s, demo_base_model(), actor="test")

        t0 = time.perf_counter()
        await asyncio.to_thread(change)
        assert await _next(it) == 1
        log.info("polling feed latency %.1f ms", (time.perf_counter() - t0) * 1000)
        await it.aclose()
    finally:
        reader.dispose()
        writer.dispose()


# another process committing a change to a SQLite registry (the revision bumped, as a write does)
_BUMP = (
    "import sqlite3, sys; c = sqlite3.connect(sys.argv[1]); "
    "c.execute('UPDATE registry_state SET revision = revision + 1 WHERE id = 1'); c.commit()"
)


def test_sqlite_probe_tells_commits_by_other_processes(tmp_path: Path, sqlite_template: Path) -> None:
    import shutil
    import subprocess
    import sys

    db = tmp_path / "probe.db"
    shutil.copyfile(sqlite_template, db)
    probe = SqliteChangeProbe(str(db))
    assert probe.changed()  # first look: unknown, so "maybe"
    assert not probe.changed() and not probe.changed()
    subprocess.run([sys.executable, "-c", _BUMP, str(db)], check=True, timeout=30)
    assert probe.changed()  # committed by another process
    assert not probe.changed()
    probe.close()
    missing = SqliteChangeProbe(str(tmp_path / "nope.db"))
    assert missing.changed() and missing.changed()  # cannot look: always "maybe"
    assert not (tmp_path / "nope.db").exists()  # and no file was created


async def test_polling_feed_reads_the_revision_only_after_a_commit(
    tmp_path: Path, sqlite_template: Path
) -> None:
    """Idle polls ask the probe, not the database; a commit by another process is still seen at
    the next poll, long before the periodic full read."""
    import shutil
    import subprocess
    import sys

    db = tmp_path / "shared.db"
    shutil.copyfile(sqlite_template, db)
    engine = make_engine(f"sqlite:///{db}")
    try:
        feed = PollingFeed(make_session_factory(engine), interval_s=0.01)
        feed.FULL_READ_S = 60.0
        it = feed.listen()
        assert await _next(it) == 0
        waiting = asyncio.create_task(_next(it, 30))  # the listener polls while it waits
        await asyncio.sleep(0.6)  # ~50 polls
        idle_reads = feed.reads
        assert idle_reads <= 2, idle_reads  # the first poll's full read (and the probe's first look)
        t0 = time.perf_counter()
        bump = [sys.executable, "-c", _BUMP, str(db)]
        await asyncio.to_thread(subprocess.run, bump, check=True, timeout=30)
        assert await waiting == 1
        assert time.perf_counter() - t0 < 10  # not the 60 s full read
        assert feed.reads == idle_reads + 1
        await it.aclose()
    finally:
        engine.dispose()


async def test_postgres_feed_latency_after_admin_call(pg_migrated: str, tmp_path: Path) -> None:
    from registry.api import create_admin_app

    engine = make_engine(pg_migrated)
    try:
        feed = make_feed(make_settings(tmp_path, pg_migrated), engine)
        assert isinstance(feed, PostgresNotifyFeed)
        app = create_admin_app(make_settings(tmp_path, pg_migrated), engine=engine, feed=feed)
        listener = PostgresNotifyFeed(pg_migrated)  # a gateway's own feed object
        it = listener.listen()
        start = await _next(it, 10)
        with session_scope(make_session_factory(engine)) as s:
            assert start == current_revision(s)
        seen: dict[int, float] = {}

        async def consume() -> None:
            async for change in it:
                seen[change.revision] = time.perf_counter()

        task = asyncio.create_task(consume())
        latencies = []
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://admin", headers=AUTH) as c:
            for i in range(6):  # the first call warms the app up and is not counted
                r = await c.post("/admin/v1/tenants", json={"id": f"feed-{i}-{time.monotonic_ns()}"})
                returned = time.perf_counter()
                assert r.status_code == 201
                want = start + i + 1
                deadline = time.monotonic() + 5
                while want not in seen and time.monotonic() < deadline:
                    await asyncio.sleep(0.001)
                assert want in seen, f"revision {want} not delivered"
                if i > 0:
                    latencies.append(max(0.0, seen[want] - returned))
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await it.aclose()
        median = sorted(latencies)[len(latencies) // 2]
        log.warning("postgres change feed latency after the admin call returned: median %.1f ms, all %s",
                    median * 1000, [round(x * 1000, 1) for x in latencies])  # fmt: skip
        # SPEC §4: within 1 s (goal well under 100 ms; ~1 ms measured on an idle machine). The
        # median keeps one scheduling hiccup of a loaded CI machine from failing the test.
        assert median < 1.0
        assert max(latencies) < 5.0
    finally:
        engine.dispose()


async def test_postgres_feed_reconnects_and_misses_nothing(pg_migrated: str) -> None:
    engine = make_engine(pg_migrated)
    factory = make_session_factory(engine)
    try:
        feed = PostgresNotifyFeed(pg_migrated, channel="lp_reconnect_test", max_backoff_s=0.2)
        it = feed.listen()
        start = await _next(it, 10)

        def bump_while_down() -> None:
            # a change the listener is not told about (no notify on its channel) ...
            with session_scope(factory) as s:
                tenant_svc.create_tenant(
                    s, tenant_id=f"rc-{time.monotonic_ns()}", name=None, limits=None,
                    base_model_access=False, actor="test",
                )  # fmt: skip
            # ... then its connection dies: after reconnecting it re-reads the revision
            with engine.begin() as conn:
                killed = conn.execute(
                    sa.text(
                        "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                        "WHERE application_name = 'loraplane-feed' AND datname = current_database()"
                    )
                ).scalar()
            assert killed == 1

        await asyncio.to_thread(bump_while_down)
        # re-read after the reconnect: what changed is unknown, so the listener must reload all
        assert await _change(it, 10) == Change(start + 1, frozenset({"*"}))

        # and after the reconnect, notifications flow again, naming what changed
        tenant_id = f"rc2-{time.monotonic_ns()}"

        def change() -> None:
            with session_scope(factory) as s:
                feed.bind_session(s)
                tenant_svc.create_tenant(
                    s, tenant_id=tenant_id, name=None, limits=None, base_model_access=False, actor="test"
                )

        await asyncio.to_thread(change)
        assert await _change(it, 10) == Change(start + 2, frozenset({f"tenant:{tenant_id}"}))
        await it.aclose()
    finally:
        engine.dispose()


def test_snapshot_contents_and_query_count(factory: Any, engine: Any) -> None:
    with session_scope(factory) as s:
        ensure_base_model(s, demo_base_model())
        for i in range(5):
            adapter_svc.create_adapter(
                s, adapter_id=f"ad-{i}", base_model="demo-base", owner="o", description=None, actor="t"
            )
        tenant_svc.create_tenant(
            s, tenant_id="acme", name="Acme", limits={"rpm": 5, "max_concurrency": 2},
            base_model_access=True, actor="t",
        )  # fmt: skip
        tenant_svc.create_tenant(
            s, tenant_id="solo", name=None, limits=None, base_model_access=False, actor="t"
        )
    for i in range(5):
        add_versions(factory, f"ad-{i}", 3)
    with session_scope(factory) as s:
        lifecycle.promote(s, "ad-0", "v1", actor="t")
        lifecycle.promote(s, "ad-0", "v2", actor="t")
        lifecycle.promote(s, "ad-0", "v3", canary_weight=25, actor="t")
        lifecycle.set_adapter_enabled(s, "ad-1", False, actor="t")
        lifecycle.disable_version(s, "ad-2", "v2", actor="t")
        tenant_svc.put_grant(s, "acme", "ad-0", rpm=7, tpm=None, actor="t")
        tenant_svc.put_grant(s, "acme", "ad-1", rpm=None, tpm=None, actor="t")
        k1 = tenant_svc.issue_key(s, "acme", actor="t")
        k2 = tenant_svc.issue_key(s, "acme", actor="t")
        tenant_svc.revoke_key(s, "acme", k2.key_id, actor="t")

    statements: list[str] = []

    def count(*args: Any) -> None:
        statements.append(str(args[2]))

    event.listen(engine, "before_cursor_execute", count)
    try:
        with session_scope(factory) as s:
            snap = load_snapshot(s)
            rev = current_revision(s)
    finally:
        event.remove(engine, "before_cursor_execute", count)
    selects = [q for q in statements if q.lstrip().upper().startswith("SELECT")]
    assert len(selects) <= 9, selects  # a fixed number, whatever the number of adapters
    assert snap.revision == rev
    assert set(snap.base_models) == {"demo-base"}
    assert snap.base_models["demo-base"].max_lora_rank == 64
    a0 = snap.adapters["ad-0"]
    assert (a0.status, a0.active_version, a0.canary_version, a0.canary_weight) == ("active", "v2", "v3", 25)
    assert {v: x.status for v, x in a0.versions.items()} == {"v1": "retired", "v2": "active", "v3": "canary"}
    v2 = a0.versions["v2"]
    assert v2.base_model == "demo-base" and v2.number == 2 and v2.rank == 8 and v2.lora_alpha == 16.0
    assert v2.weights_sha256 == f"{101:064x}" and v2.lora_name == f"ad-0@v2-{v2.weights_sha256[:8]}"
    assert v2.total_bytes == 110
    assert snap.adapters["ad-1"].status == "disabled"
    assert snap.adapters["ad-2"].versions["v2"].status == "disabled"
    acme = snap.tenants["acme"]
    assert (acme.name, acme.base_model_access) == ("Acme", True)
    assert (acme.limits.rpm, acme.limits.tpm, acme.limits.max_concurrency) == (5, None, 2)
    assert set(acme.grants) == {"ad-0", "ad-1"} and acme.grants["ad-0"].rpm == 7
    assert snap.tenants["solo"].grants == {}
    keys = [k for ks in snap.keys_by_prefix.values() for k in ks]
    assert [k.key_id for k in keys] == [k1.key_id]
    assert keys[0].key_hash == hash_key(k1.key) and keys[0].tenant_id == "acme"
    # the snapshot follows later changes
    with session_scope(factory) as s:
        lifecycle.rollback(s, "ad-0", actor="t")
    with session_scope(factory) as s:
        snap2 = load_snapshot(s)
    assert snap2.revision == snap.revision + 1
    # (a rollback during a canary ends the canary and keeps the active version, SPEC §19)
    assert (snap2.adapters["ad-0"].active_version, snap2.adapters["ad-0"].canary_version) == ("v2", None)


async def test_db_audit_sink_records_router_events(factory: Any) -> None:
    from registry.services.audit import DbAuditSink, list_events

    sink = DbAuditSink(factory)
    with session_scope(factory) as s:
        rev = current_revision(s)
    await sink.record(
        actor="router", action="adapter.loaded", subject_type="adapter", subject_id="ad",
        details={"version": "v1", "replica": "http://127.0.0.1:1", "duration_ms": 3},
    )  # fmt: skip
    with session_scope(factory) as s:
        ev = list_events(s, action="adapter.loaded").data
        assert current_revision(s) == rev  # load events do not change routing
    assert len(ev) == 1 and ev[0].details["duration_ms"] == 3 and ev[0].subject_type == "adapter"


def test_ensure_base_model_is_idempotent(factory: Any) -> None:
    from registry.services.audit import list_events

    for _ in range(3):
        with session_scope(factory) as s:
            ensure_base_model(s, demo_base_model())
    with session_scope(factory) as s:
        assert [e.action for e in list_events(s).data] == ["base_model.created"]
        assert load_snapshot(s).base_models["demo-base"].hf_id == "loraplane/demo-base"
