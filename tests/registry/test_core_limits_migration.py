"""Migration 0005 (limits per adapter and per owner) on SQLite and PostgreSQL, with data: rows
that existed before read unlimited, limits round-trip, and a downgrade keeps the adapters, their
versions and grants (SQLite's foreign keys included)."""

from __future__ import annotations

from pathlib import Path

import sqlalchemy as sa
from alembic import command

from kit import localservices as ls
from kit.db import make_engine
from registry import migrate
from tests.registry.migration_support import seed_adapter_rows

BEFORE = "0004"


def _seed(conn: sa.Connection) -> None:
    """Rows at 0004: a base model, an adapter with an owner, a version, a tenant with a grant."""
    seed_adapter_rows(conn, owner="Payments EU")
    conn.execute(sa.text(
        "INSERT INTO tenants (id, name, rpm, base_model_access, created_at) "
        "VALUES ('t', 't', 60, false, CURRENT_TIMESTAMP)"
    ))  # fmt: skip
    conn.execute(sa.text("INSERT INTO grants (tenant_id, adapter_id, rpm) VALUES ('t', 'a', 5)"))


def _round_trip(url: str) -> None:
    migrate.upgrade(url, BEFORE)
    engine = make_engine(url)
    try:
        with engine.begin() as conn:
            _seed(conn)
        migrate.upgrade(url, "0005")
        with engine.begin() as conn:
            row = conn.execute(sa.text("SELECT owner, rpm, tpm, max_concurrency FROM adapters")).one()
            assert tuple(row) == ("Payments EU", None, None, None)  # existing adapters: unlimited
            assert conn.execute(sa.text("SELECT count(*) FROM owners")).scalar() == 0
            conn.execute(sa.text("UPDATE adapters SET rpm = 100, max_concurrency = 4 WHERE id = 'a'"))
            conn.execute(sa.text(
                "INSERT INTO owners (name, rpm, tpm, max_concurrency, updated_at) "
                "VALUES ('Payments EU', 600, NULL, 8, CURRENT_TIMESTAMP)"
            ))  # fmt: skip
        with engine.connect() as conn:
            got = conn.execute(sa.text("SELECT rpm, tpm, max_concurrency FROM adapters")).one()
            assert tuple(got) == (100, None, 4)
            owner = conn.execute(sa.text("SELECT name, rpm, max_concurrency FROM owners")).one()
            assert tuple(owner) == ("Payments EU", 600, 8)
        migrate.upgrade(url)  # and anything after it
        command.downgrade(migrate.alembic_config(url), BEFORE)
        assert migrate.current(url) == BEFORE
        with engine.connect() as conn:
            insp = sa.inspect(conn)
            assert "owners" not in insp.get_table_names()
            assert not {"rpm", "tpm", "max_concurrency"} & {c["name"] for c in insp.get_columns("adapters")}
            checks = {c["name"] for c in insp.get_check_constraints("adapters")}
            assert {"ck_adapters_status", "ck_adapters_canary_weight"} <= checks
            assert conn.execute(sa.text("SELECT id, owner FROM adapters")).one() == ("a", "Payments EU")
            assert conn.execute(sa.text("SELECT count(*) FROM versions")).scalar() == 1
            assert conn.execute(sa.text("SELECT rpm FROM grants")).scalar() == 5
        migrate.upgrade(url)
        assert migrate.current(url) == migrate.head()
        with engine.connect() as conn:
            assert conn.execute(sa.text("SELECT rpm FROM adapters")).scalar() is None
    finally:
        engine.dispose()


def test_limits_migration_sqlite(tmp_path: Path) -> None:
    _round_trip(f"sqlite:///{tmp_path}/limits.db")


def test_limits_migration_postgresql() -> None:
    with ls.temp_pg_database("limits") as url:
        _round_trip(url)
