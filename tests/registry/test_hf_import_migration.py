"""Migration 0006 (``versions.source_uri`` / ``source_revision``) on SQLite and PostgreSQL, with
data: versions that existed before read null, the columns round-trip, and a downgrade keeps the
versions (SQLite's foreign keys included)."""

from __future__ import annotations

from pathlib import Path

import sqlalchemy as sa
from alembic import command

from kit import localservices as ls
from kit.db import make_engine
from registry import migrate
from tests.registry.migration_support import seed_adapter_rows

BEFORE, MINE = "0005", "0006"
SHA = "0123456789abcdef0123456789abcdef01234567"


def _seed(conn: sa.Connection) -> None:
    seed_adapter_rows(conn, owner="team")
    conn.execute(sa.text("INSERT INTO tenants (id, name, base_model_access, created_at) "
                         "VALUES ('t', 't', false, CURRENT_TIMESTAMP)"))  # fmt: skip
    conn.execute(sa.text("INSERT INTO grants (tenant_id, adapter_id) VALUES ('t', 'a')"))


def _round_trip(url: str) -> None:
    migrate.upgrade(url, BEFORE)
    engine = make_engine(url)
    try:
        with engine.begin() as conn:
            _seed(conn)
        migrate.upgrade(url, MINE)
        with engine.begin() as conn:
            row = conn.execute(sa.text("SELECT source_uri, source_revision FROM versions")).one()
            assert tuple(row) == (None, None)  # uploaded before: no source
            conn.execute(
                sa.text("UPDATE versions SET source_uri = :u, source_revision = :r"),
                {"u": "hf://my-org/lora@main/sub", "r": SHA},
            )
        with engine.connect() as conn:
            got = conn.execute(sa.text("SELECT source_uri, source_revision FROM versions")).one()
            assert tuple(got) == ("hf://my-org/lora@main/sub", SHA)
        migrate.upgrade(url)  # and anything after it
        command.downgrade(migrate.alembic_config(url), BEFORE)
        assert migrate.current(url) == BEFORE
        with engine.connect() as conn:
            cols = {c["name"] for c in sa.inspect(conn).get_columns("versions")}
            assert not {"source_uri", "source_revision"} & cols
            assert conn.execute(sa.text("SELECT adapter_id, number FROM versions")).one() == ("a", 1)
            assert conn.execute(sa.text("SELECT count(*) FROM grants")).scalar() == 1
        migrate.upgrade(url)
        assert migrate.current(url) == migrate.head()
    finally:
        engine.dispose()


def test_source_migration_sqlite(tmp_path: Path) -> None:
    _round_trip(f"sqlite:///{tmp_path}/source.db")


def test_source_migration_postgresql() -> None:
    with ls.temp_pg_database("hfsource") as url:
        _round_trip(url)
