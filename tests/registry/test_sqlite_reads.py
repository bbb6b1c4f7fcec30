"""On SQLite, reads do not queue behind a writer (issue 24.20): WAL lets a reader read its snapshot
while another connection holds the write lock, so read-only transactions begin deferred; writes
keep ``BEGIN IMMEDIATE`` and serialise. Before, every transaction took ``BEGIN IMMEDIATE`` and a
plain list waited for the open write (2.06 s measured)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine, text

from kit.db import session_scope
from tests.registry.core_support import seed_adapter

HOLD_S = 4.0


@pytest.fixture
def writer_holding_the_lock(engine: Engine) -> Iterator[threading.Event]:
    """Another connection opens a write transaction (``BEGIN IMMEDIATE`` and a write) and holds
    it for ``HOLD_S``; the event is set once it holds the lock."""
    holding, done = threading.Event(), threading.Event()

    def hold() -> None:
        with engine.connect() as conn, conn.begin() as tx:  # kit.db: BEGIN IMMEDIATE
            conn.execute(text("UPDATE registry_state SET revision = revision"))
            holding.set()
            done.wait(HOLD_S)
            tx.rollback()

    t = threading.Thread(target=hold, daemon=True)
    t.start()
    assert holding.wait(10)
    yield holding
    done.set()
    t.join(10)


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_a_list_answers_while_another_connection_holds_a_write_transaction(
    client: TestClient, engine: Engine, request: pytest.FixtureRequest
) -> None:
    seed_adapter(client, "support")
    request.getfixturevalue("writer_holding_the_lock")
    t0 = time.monotonic()
    r = client.get("/admin/v1/adapters")  # authentication and the list: both reads
    took = time.monotonic() - t0
    assert r.status_code == 200 and [a["id"] for a in r.json()["data"]] == ["support"]
    assert took < HOLD_S / 2, took  # behind the writer it would take HOLD_S


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_writes_still_serialise_behind_the_open_write(
    engine: Engine, factory: Any, request: pytest.FixtureRequest
) -> None:
    """A write waits for the lock (busy timeout) instead of failing on a lock upgrade, and a read
    meanwhile sees the last committed state at once."""
    request.getfixturevalue("writer_holding_the_lock")
    t0 = time.monotonic()
    with session_scope(factory, read_only=True) as s:
        before = s.execute(text("SELECT revision FROM registry_state")).scalar_one()
    assert time.monotonic() - t0 < HOLD_S / 2
    t0 = time.monotonic()
    with session_scope(factory) as s:
        s.execute(text("UPDATE registry_state SET revision = revision + 1"))
    assert time.monotonic() - t0 >= HOLD_S * 0.75  # waited for the other writer, then wrote
    with session_scope(factory, read_only=True) as s:
        assert s.execute(text("SELECT revision FROM registry_state")).scalar_one() == before + 1
