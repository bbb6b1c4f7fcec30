"""`loraplane db upgrade` under the PostgreSQL advisory lock, and a newer schema that a future
migration declares compatible (a pod of the previous release restarting after the new release
migrated must still start)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import sqlalchemy as sa

from kit import localservices as ls
from kit.db import make_engine
from kit.errors import Unavailable
from registry import migrate

MIGRATIONS = Path(migrate.alembic_config().get_main_option("script_location") or "")


def _future_tree(tmp_path: Path, compatible: bool) -> Path:
    """Our migration tree plus one newer revision, as the next release would ship it."""
    tree = tmp_path / f"migrations-{compatible}"
    shutil.copytree(MIGRATIONS, tree, ignore=shutil.ignore_patterns("__pycache__"))
    declaration = "backward_compatible = True\n" if compatible else ""
    (tree / "versions" / "9001_future.py").write_text(
        f'''"""A column the next release adds."""
import sqlalchemy as sa
from alembic import op

revision = "9001"
down_revision = "{migrate.head()}"
branch_labels = None
depends_on = None
{declaration}

def upgrade() -> None:
    with op.batch_alter_table("adapters") as batch_op:
        batch_op.add_column(sa.Column("future_note", sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("adapters") as batch_op:
        batch_op.drop_column("future_note")
'''
    )
    return tree


def _advisory_waiters(url: str) -> int:
    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            q = "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
            return int(conn.execute(sa.text(q)).scalar() or 0)
    finally:
        engine.dispose()


def test_concurrent_upgrades_wait_for_the_lock_and_apply_each_migration_once() -> None:
    """Three `loraplane db upgrade` processes (three registry pods) queue on the lock."""
    with ls.temp_pg_database("mlock") as url:
        holder = make_engine(url)
        conn = holder.connect()
        conn.execute(sa.text("SELECT pg_advisory_lock(:k)"), {"k": migrate.MIGRATION_LOCK_KEY})
        env = {**os.environ, "LORAPLANE_DATABASE_URL": url}
        procs = [
            subprocess.Popen(
                [sys.executable, "-m", "loraplane.cli", "db", "upgrade"],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
            for _ in range(3)
        ]
        try:
            deadline = time.monotonic() + 120
            while _advisory_waiters(url) < 3 and time.monotonic() < deadline:
                assert all(p.poll() is None for p in procs), "an upgrade ran past the held lock"
                time.sleep(0.2)
            assert _advisory_waiters(url) == 3
            assert migrate.current(url) is None  # nothing applied while the lock is held
        finally:
            conn.execute(sa.text("SELECT pg_advisory_unlock(:k)"), {"k": migrate.MIGRATION_LOCK_KEY})
            conn.close()
            holder.dispose()
        outputs = [p.communicate(timeout=180)[0] for p in procs]
        assert [p.returncode for p in procs] == [0, 0, 0], outputs
        assert migrate.current(url) == migrate.head()
        engine = make_engine(url)
        try:
            migrate.check_schema(engine)
            with engine.connect() as conn:
                lineage = conn.execute(sa.text(f"SELECT revision FROM {migrate.LINEAGE_TABLE}")).scalars()
                assert migrate.head() in set(lineage)
        finally:
            engine.dispose()


def test_newer_compatible_schema_is_accepted_by_the_previous_release(tmp_path: Path) -> None:
    future = _future_tree(tmp_path, compatible=True)
    with ls.temp_pg_database("mcompat") as url:
        migrate.upgrade(url, script_location=future)  # the new release migrates
        assert migrate.current(url) == "9001"
        engine = make_engine(url)
        try:
            migrate.check_schema(engine)  # the previous release still starts
        finally:
            engine.dispose()
        migrate.upgrade(url)  # and its `db upgrade` init step is a no-op
        assert migrate.current(url) == "9001"


def test_newer_undeclared_schema_is_refused_with_a_clear_message(tmp_path: Path) -> None:
    future = _future_tree(tmp_path, compatible=False)
    with ls.temp_pg_database("mnewer") as url:
        migrate.upgrade(url, script_location=future)
        engine = make_engine(url)
        try:
            with pytest.raises(Unavailable) as exc:
                migrate.check_schema(engine)
            assert exc.value.code == "stale_schema"
            assert "newer than this release's head" in exc.value.message
        finally:
            engine.dispose()
        with pytest.raises(migrate.NewerSchemaError, match="run a newer loraplane"):
            migrate.upgrade(url)
        assert migrate.current(url) == "9001"


def test_sqlite_keeps_no_lineage_so_only_head_is_accepted(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/x.db"
    migrate.upgrade(url, script_location=_future_tree(tmp_path, compatible=True))
    engine = make_engine(url)
    try:
        with pytest.raises(Unavailable):
            migrate.check_schema(engine)
    finally:
        engine.dispose()
