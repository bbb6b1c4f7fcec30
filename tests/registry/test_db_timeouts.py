"""The admin API's database bounds (SPEC §18; ``LORAPLANE_DATABASE_TIMEOUT_S``, ``kit.pgconn``):
no pooled connection free within the bound is 503 ``database_unavailable`` (it was a 500), a
statement past it is ended by the server with the same 503, and the connection pool recovers.
The hung-server cases (SIGSTOP) are in ``tests/faults/test_fault_postgres.py``."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import text
from sqlalchemy.exc import OperationalError

from kit.db import make_engine
from registry.api import create_admin_app
from tests.registry.core_support import AUTH, make_settings

V1 = "/admin/v1"


def test_no_free_pooled_connection_is_503_database_unavailable(pg_migrated: str, tmp_path: Path) -> None:
    engine = make_engine(pg_migrated, timeout_s=1.0, pool_size=1, max_overflow=0)
    try:
        app = create_admin_app(make_settings(tmp_path, pg_migrated), engine=engine)
        with TestClient(app, headers=AUTH) as c:
            held = engine.connect()  # the pool's only connection, busy elsewhere
            try:
                t0 = time.monotonic()
                r = c.get(f"{V1}/adapters")
                took = time.monotonic() - t0
            finally:
                held.close()
            assert r.status_code == 503, r.text
            assert r.json()["error"]["code"] == "database_unavailable"
            assert took < 5.0
            assert c.get(f"{V1}/adapters").status_code == 200  # free again: served
    finally:
        engine.dispose()


def test_statement_past_the_bound_is_ended_by_the_server(pg_migrated: str) -> None:
    """On a live server the server's ``statement_timeout`` (a share of the bound) ends a slow
    statement first, with its own error; the connection stays usable."""
    engine = make_engine(pg_migrated, timeout_s=1.0)
    try:
        with engine.connect() as conn:
            with pytest.raises(OperationalError, match="statement timeout"):
                conn.execute(text("SELECT pg_sleep(3)"))
            conn.rollback()
            assert conn.execute(text("SELECT 1")).scalar() == 1
    finally:
        engine.dispose()


def test_settings_bound_reaches_the_engine_the_admin_api_builds(pg_migrated: str, tmp_path: Path) -> None:
    app = create_admin_app(make_settings(tmp_path, pg_migrated, database_timeout_s=1.0))
    engine = app.state.admin.engine
    try:
        with engine.connect() as conn:
            assert conn.execute(text("SHOW statement_timeout")).scalar() == "800ms"
    finally:
        engine.dispose()
