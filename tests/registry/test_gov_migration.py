"""Migration 0004 (governance) on SQLite and PostgreSQL, from 0003 with data in the tables:
existing base models read ``approvals_required`` 0 and adapters null (the base model's), the new
tables take rows, the schema at head has no drift, and a downgrade to 0003 keeps the data."""

from __future__ import annotations

from pathlib import Path

import sqlalchemy as sa
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext

import registry.models  # noqa: F401 - tables on the metadata
from kit import localservices as ls
from kit.db import make_engine
from kit.orm import Base
from registry import migrate


def _round_trip(url: str) -> None:
    migrate.upgrade(url, "0003")
    engine = make_engine(url)
    try:
        with engine.begin() as conn:
            conn.execute(sa.text(
                "INSERT INTO base_models (name, hf_id, max_lora_rank, target_modules, created_at) "
                "VALUES ('b', 'o/b', 8, '[\"q_proj\"]', CURRENT_TIMESTAMP)"
            ))  # fmt: skip
            conn.execute(sa.text(
                "INSERT INTO adapters (id, base_model, owner, status, created_at) "
                "VALUES ('a', 'b', 'team-a', 'active', CURRENT_TIMESTAMP)"
            ))  # fmt: skip
            conn.execute(sa.text(
                "INSERT INTO versions (adapter_id, number, status, rank, lora_alpha, target_modules, files, "
                "storage_uri, quality_gate, created_by, created_at) VALUES ('a', 1, 'active', 8, 16.0, "
                "'[\"q_proj\"]', '[]', 'file:///x/', 'skipped', 't', CURRENT_TIMESTAMP)"
            ))  # fmt: skip
        migrate.upgrade(url, "0004")
        with engine.begin() as conn:
            assert conn.execute(sa.text("SELECT approvals_required FROM base_models")).scalar() == 0
            assert conn.execute(sa.text("SELECT approvals_required FROM adapters")).scalar() is None
            conn.execute(sa.text(
                "INSERT INTO principals (id, role, owners, created_by, created_at) "
                "VALUES ('mia', 'maintainer', '[\"team-a\"]', 'bootstrap', CURRENT_TIMESTAMP)"
            ))  # fmt: skip
            conn.execute(sa.text(
                "INSERT INTO principal_tokens (token_id, principal_id, prefix, token_hash, created_at) "
                "VALUES ('t1', 'mia', 'lpa-abcdefgh', 'ff', CURRENT_TIMESTAMP)"
            ))  # fmt: skip
            conn.execute(sa.text(
                "INSERT INTO promotion_requests (id, adapter_id, version, requested_by, status, "
                "approvals_required, approvals, seen_version_status, created_at, expires_at) VALUES "
                "('pr-1', 'a', 1, 'mia', 'pending', 1, '[]', 'ready', CURRENT_TIMESTAMP, CURRENT_TIMESTAMP)"
            ))  # fmt: skip
            force = conn.execute(sa.text("SELECT force FROM promotion_requests")).scalar()
            assert not force
        migrate.upgrade(url)
        assert migrate.current(url) == migrate.head()
        with engine.connect() as conn:
            ctx = MigrationContext.configure(conn, opts={"compare_type": True})
            assert compare_metadata(ctx, Base.metadata) == []
            assert conn.execute(sa.text("SELECT count(*) FROM promotion_requests")).scalar() == 1
        command.downgrade(migrate.alembic_config(url), "0003")
        with engine.connect() as conn:
            insp = sa.inspect(conn)
            assert not {"principals", "principal_tokens", "promotion_requests"} & set(insp.get_table_names())
            assert "approvals_required" not in {c["name"] for c in insp.get_columns("base_models")}
            assert "approvals_required" not in {c["name"] for c in insp.get_columns("adapters")}
            assert {"ck_adapters_status"} <= {c["name"] for c in insp.get_check_constraints("adapters")}
            assert conn.execute(sa.text("SELECT owner FROM adapters")).scalar() == "team-a"
            assert conn.execute(sa.text("SELECT count(*) FROM versions")).scalar() == 1
        migrate.upgrade(url)
        assert migrate.current(url) == migrate.head()
    finally:
        engine.dispose()


def test_governance_migration_sqlite(tmp_path: Path) -> None:
    _round_trip(f"sqlite:///{tmp_path}/gov.db")


def test_governance_migration_postgresql() -> None:
    with ls.temp_pg_database("gov") as url:
        _round_trip(url)
