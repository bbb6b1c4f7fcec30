"""Migration 0010 (``tenants.max_cold_waiters``) on SQLite and PostgreSQL, with data: tenants that
existed before read unlimited (null), the limit round-trips, and a downgrade keeps the tenants,
their keys and grants (SQLite's foreign keys included)."""

from __future__ import annotations

from pathlib import Path

import sqlalchemy as sa
from alembic import command

from kit import localservices as ls
from kit.db import make_engine
from registry import migrate
from tests.registry.migration_support import seed_adapter_rows

BEFORE = "0009"


def _seed(conn: sa.Connection) -> None:
    """Rows at 0009: a base model, an adapter and its version, a tenant with a key and a grant."""
    seed_adapter_rows(conn, owner="team-a")
    conn.execute(sa.text(
        "INSERT INTO tenants (id, name, rpm, base_model_access, created_at) "
        "VALUES ('t', 't', 60, false, CURRENT_TIMESTAMP)"
    ))  # fmt: skip
    conn.execute(sa.text(
        "INSERT INTO api_keys (key_id, tenant_id, prefix, key_hash, created_at) "
        "VALUES ('key_1', 't', 'lp-abc', 'h', CURRENT_TIMESTAMP)"
    ))  # fmt: skip
    conn.execute(sa.text("INSERT INTO grants (tenant_id, adapter_id, rpm) VALUES ('t', 'a', 5)"))


def _round_trip(url: str) -> None:
    migrate.upgrade(url, BEFORE)
    engine = make_engine(url)
    try:
        with engine.begin() as conn:
            _seed(conn)
        migrate.upgrade(url, "0010")
        with engine.begin() as conn:
            row = conn.execute(sa.text("SELECT rpm, max_cold_waiters FROM tenants")).one()
            assert tuple(row) == (60, None)  # existing tenants: unlimited
            conn.execute(sa.text("UPDATE tenants SET max_cold_waiters = 2 WHERE id = 't'"))
        with engine.connect() as conn:
            assert conn.execute(sa.text("SELECT max_cold_waiters FROM tenants")).scalar() == 2
        migrate.upgrade(url)  # and anything after it
        command.downgrade(migrate.alembic_config(url), BEFORE)
        assert migrate.current(url) == BEFORE
        with engine.connect() as conn:
            cols = {c["name"] for c in sa.inspect(conn).get_columns("tenants")}
            assert "max_cold_waiters" not in cols and {"rpm", "tpm", "max_concurrency"} <= cols
            assert tuple(conn.execute(sa.text("SELECT id, rpm FROM tenants")).one()) == ("t", 60)
            assert conn.execute(sa.text("SELECT key_id FROM api_keys")).scalar() == "key_1"
            assert conn.execute(sa.text("SELECT rpm FROM grants")).scalar() == 5
        migrate.upgrade(url)
        assert migrate.current(url) == migrate.head()
        with engine.connect() as conn:
            assert conn.execute(sa.text("SELECT max_cold_waiters FROM tenants")).scalar() is None
    finally:
        engine.dispose()


def test_max_cold_waiters_migration_sqlite(tmp_path: Path) -> None:
    _round_trip(f"sqlite:///{tmp_path}/cold.db")


def test_max_cold_waiters_migration_postgresql() -> None:
    with ls.temp_pg_database("coldwait") as url:
        _round_trip(url)
