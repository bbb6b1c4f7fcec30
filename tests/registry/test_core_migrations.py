"""Migrations: one head, upgrade on SQLite and PostgreSQL, no drift from the models, and the
stale-schema guard that services run at start."""

from __future__ import annotations

from pathlib import Path
from typing import cast

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Connection

import registry.models  # noqa: F401 - tables on the metadata
from kit import localservices as ls
from kit.db import make_engine
from kit.errors import Unavailable
from kit.orm import Base
from registry import migrate
from tests.registry.core_support import make_settings

EXPECTED_TABLES = {
    "base_models", "adapters", "versions", "tenants", "api_keys", "grants", "audit_events", "registry_state",
}  # fmt: skip


def test_single_head() -> None:
    heads = ScriptDirectory.from_config(migrate.alembic_config()).get_heads()
    assert len(heads) == 1
    assert migrate.head() == heads[0]


def _assert_at_head_without_drift(url: str) -> None:
    _assert_at_head_without_drift_except_seed(url)
    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            import sqlalchemy as sa

            assert set(sa.inspect(conn).get_table_names()) >= EXPECTED_TABLES
            assert conn.execute(sa.text("SELECT revision FROM registry_state WHERE id = 1")).scalar() == 0
        migrate.check_schema(engine)  # does not raise
    finally:
        engine.dispose()


def test_upgrade_sqlite_from_empty_and_no_drift(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/fresh.db"
    assert migrate.current(url) is None
    migrate.upgrade(url)
    _assert_at_head_without_drift(url)
    migrate.upgrade(url)  # idempotent
    assert migrate.current(url) == migrate.head()


def test_upgrade_postgresql_and_no_drift(pg_migrated: str) -> None:
    _assert_at_head_without_drift(pg_migrated)


def test_stale_schema_is_refused(tmp_path: Path) -> None:
    from registry.api import create_admin_app

    url = f"sqlite:///{tmp_path}/stale.db"
    engine = make_engine(url)
    try:
        with pytest.raises(Unavailable) as exc:
            migrate.check_schema(engine)
        assert exc.value.code == "stale_schema"
        assert exc.value.message == "database schema is not at head: run `loraplane db upgrade`"
        with pytest.raises(Unavailable, match="loraplane db upgrade"):
            create_admin_app(make_settings(tmp_path, url), engine=engine)
    finally:
        engine.dispose()


def test_stale_schema_is_refused_on_postgresql() -> None:
    with ls.temp_pg_database("stale") as url:
        engine = make_engine(url)
        try:
            with pytest.raises(Unavailable) as exc:
                migrate.check_schema(engine)
            assert exc.value.code == "stale_schema"
        finally:
            engine.dispose()


def test_downgrade_and_upgrade_round_trip(tmp_path: Path) -> None:
    from alembic import command

    url = f"sqlite:///{tmp_path}/rt.db"
    migrate.upgrade(url)
    command.downgrade(migrate.alembic_config(url), "base")
    assert migrate.current(url) is None
    migrate.upgrade(url)
    _assert_at_head_without_drift(url)


def _insert_base_and_adapter(conn: Connection, adapter_id: str) -> None:
    """Raw rows at an old revision: base model ``b`` and active adapter ``adapter_id`` on it."""
    import sqlalchemy as sa

    conn.execute(sa.text(
        "INSERT INTO base_models (name, hf_id, max_lora_rank, target_modules, created_at) "
        "VALUES ('b', 'o/b', 8, '[\"q_proj\"]', CURRENT_TIMESTAMP)"
    ))  # fmt: skip
    conn.execute(
        sa.text(
            "INSERT INTO adapters (id, base_model, status, created_at) "
            "VALUES (:id, 'b', 'active', CURRENT_TIMESTAMP)"
        ),
        {"id": adapter_id},
    )


def _hot_column_round_trip(url: str) -> None:
    """0002 adds ``adapters.hot``: rows that existed before read false, new rows default to false
    at the database level, and downgrading to 0001 keeps the table's constraints."""
    import sqlalchemy as sa
    from alembic import command

    migrate.upgrade(url, "0001")
    engine = make_engine(url)
    try:
        with engine.begin() as conn:
            _insert_base_and_adapter(conn, "old")
        migrate.upgrade(url)
        with engine.begin() as conn:
            conn.execute(sa.text(
                "INSERT INTO adapters (id, base_model, status, created_at) "
                "VALUES ('new', 'b', 'active', CURRENT_TIMESTAMP)"
            ))  # fmt: skip
            rows = conn.execute(sa.text("SELECT id, hot FROM adapters ORDER BY id")).all()
        assert [(r[0], bool(r[1])) for r in rows] == [("new", False), ("old", False)]
        _assert_at_head_without_drift_except_seed(url)
        command.downgrade(migrate.alembic_config(url), "0001")
        assert migrate.current(url) == "0001"
        with engine.connect() as conn:
            insp = sa.inspect(conn)
            assert "hot" not in {c["name"] for c in insp.get_columns("adapters")}
            checks = {c["name"] for c in insp.get_check_constraints("adapters")}
            assert {"ck_adapters_status", "ck_adapters_canary_weight"} <= checks
            assert conn.execute(sa.text("SELECT count(*) FROM adapters")).scalar() == 2
        migrate.upgrade(url)
        assert migrate.current(url) == migrate.head()
    finally:
        engine.dispose()


def _assert_at_head_without_drift_except_seed(url: str) -> None:
    assert migrate.current(url) == migrate.head()
    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            ctx = MigrationContext.configure(conn, opts={"compare_type": True})
            assert compare_metadata(ctx, Base.metadata) == []
    finally:
        engine.dispose()


def test_adapter_hot_migration_sqlite(tmp_path: Path) -> None:
    _hot_column_round_trip(f"sqlite:///{tmp_path}/hot.db")


def test_adapter_hot_migration_postgresql() -> None:
    with ls.temp_pg_database("hot") as url:
        _hot_column_round_trip(url)


def _gate_details_round_trip(url: str) -> None:
    """0003 adds ``versions.quality_gate_details``: versions that existed before read null, a JSON
    object round-trips, and downgrading to 0002 keeps the rows, constraints and partial indexes."""
    import sqlalchemy as sa
    from alembic import command

    from registry.models import VersionRow

    migrate.upgrade(url, "0002")
    engine = make_engine(url)
    version_cols = (
        "adapter_id, number, status, rank, lora_alpha, target_modules, files, storage_uri, "
        "quality_gate, created_by, created_at"
    )
    try:
        with engine.begin() as conn:
            _insert_base_and_adapter(conn, "a")
            conn.execute(sa.text(
                f"INSERT INTO versions ({version_cols}) VALUES ('a', 1, 'active', 8, 16.0, "
                "'[\"q_proj\"]', '[]', 'file:///x/', 'pending', 't', CURRENT_TIMESTAMP)"
            ))  # fmt: skip
        migrate.upgrade(url)  # 0003 and every later migration
        scores = {"accuracy": 0.91, "suite": "evals", "cases": [1, 2]}
        with engine.begin() as conn:
            assert conn.execute(sa.text("SELECT quality_gate_details FROM versions")).scalar() is None
            conn.execute(
                sa.update(cast(sa.Table, VersionRow.__table__))
                .where(cast(sa.Table, VersionRow.__table__).c.number == 1)
                .values(quality_gate="passed", quality_gate_details=scores)
            )
            got = conn.execute(sa.select(VersionRow.__table__.c.quality_gate_details)).scalar()
        assert got == scores
        _assert_at_head_without_drift_except_seed(url)
        command.downgrade(migrate.alembic_config(url), "0002")
        assert migrate.current(url) == "0002"
        with engine.connect() as conn:
            insp = sa.inspect(conn)
            assert "quality_gate_details" not in {c["name"] for c in insp.get_columns("versions")}
            checks = {c["name"] for c in insp.get_check_constraints("versions")}
            assert {"ck_versions_status", "ck_versions_quality_gate"} <= checks
            indexes = {i["name"] for i in insp.get_indexes("versions")}
            assert {"uq_versions_one_active", "uq_versions_one_canary"} <= indexes
            row = conn.execute(sa.text("SELECT number, status, quality_gate FROM versions")).one()
            assert tuple(row) == (1, "active", "passed")
        migrate.upgrade(url)
        assert migrate.current(url) == migrate.head()
        with engine.connect() as conn:
            assert conn.execute(sa.text("SELECT quality_gate_details FROM versions")).scalar() is None
    finally:
        engine.dispose()


def test_quality_gate_details_migration_sqlite(tmp_path: Path) -> None:
    _gate_details_round_trip(f"sqlite:///{tmp_path}/gate.db")


def test_quality_gate_details_migration_postgresql() -> None:
    with ls.temp_pg_database("gate") as url:
        _gate_details_round_trip(url)
