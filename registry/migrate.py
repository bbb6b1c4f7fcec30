"""Schema migrations: upgrade, current revision, head, and the stale-schema guard.

The Alembic ``Config`` is built in code with ``script_location`` pointing at the installed
``migrations`` package, so it works from any working directory and from a wheel.

- ``upgrade(url)``: migrate the database at ``url`` to head.
- ``current(url)``: its revision, or None for an empty database.
- ``head()``: the head revision of the tree.
- ``check_schema(engine)``: raise ``Unavailable(code="stale_schema")`` unless the schema is
  our head or a newer one declared compatible; the admin API and every service call it at start.

Concurrency: on PostgreSQL ``upgrade`` holds a transaction-scoped advisory lock
(``pg_advisory_xact_lock(MIGRATION_LOCK_KEY)``) around the whole run, so two registry pods
running ``loraplane db upgrade`` at once apply each migration once: the second waits, then
finds the schema at head and does nothing.

Newer compatible schemas (rolling upgrades and restarts): a migration module may declare

    backward_compatible = True   # code at down_revision still runs on this schema

(additive changes: a nullable column, a new table or index). Every PostgreSQL ``upgrade``
records the lineage of its tree — revision, down_revision, backward_compatible — in
``loraplane_meta.schema_lineage`` (a schema of its own, outside the models' metadata). An older
release that finds the database at a revision it does not know walks that lineage down to
its own head; if every step on the way is declared compatible, ``check_schema`` accepts the
database and ``upgrade`` is a no-op, so a pod of the previous release restarting after the new
release migrated still starts. Anything else (an undeclared step, an unknown lineage, SQLite,
which keeps no lineage) is refused with a message naming both revisions.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import sqlalchemy as sa
from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from alembic.util import CommandError
from sqlalchemy import Connection, Engine

import migrations
from kit.db import make_engine, normalize_url
from kit.errors import Unavailable

log = logging.getLogger("loraplane.migrate")

STALE_MESSAGE = "database schema is not at head: run `loraplane db upgrade`"
# pg_advisory_xact_lock key of `loraplane db upgrade` (any constant; this is b"lorapl" as int)
MIGRATION_LOCK_KEY = 0x6C6F7261706C
LINEAGE_SCHEMA = "loraplane_meta"
LINEAGE_TABLE = f"{LINEAGE_SCHEMA}.schema_lineage"
COMPAT_ATTRIBUTE = "backward_compatible"


class NewerSchemaError(CommandError):
    """The database is at a revision this release does not know and cannot run on."""


@dataclass(frozen=True)
class LineageStep:
    revision: str
    down_revision: str | None
    backward_compatible: bool


def alembic_config(url: str | None = None, script_location: Path | None = None) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(script_location or Path(migrations.__file__).parent))
    if url:
        cfg.set_main_option("sqlalchemy.url", normalize_url(url).replace("%", "%%"))
    return cfg


def head(script_location: Path | None = None) -> str:
    heads = ScriptDirectory.from_config(alembic_config(script_location=script_location)).get_heads()
    if len(heads) != 1:
        raise RuntimeError(f"migration tree must have exactly one head, found {heads}")
    return heads[0]


def tree_lineage(script_location: Path | None = None) -> list[LineageStep]:
    """Every revision of our tree with its parent and its ``backward_compatible`` declaration."""
    scripts = ScriptDirectory.from_config(alembic_config(script_location=script_location))
    steps = []
    for script in scripts.walk_revisions():
        down = script.down_revision
        if down is not None and not isinstance(down, str):
            raise RuntimeError(f"migration {script.revision} merges several parents: {down}")
        compatible = vars(script.module).get(COMPAT_ATTRIBUTE, False) is True
        steps.append(LineageStep(script.revision, down, compatible))
    return steps


def _record_lineage(conn: Connection, steps: list[LineageStep]) -> None:
    conn.execute(sa.text(f"CREATE SCHEMA IF NOT EXISTS {LINEAGE_SCHEMA}"))
    conn.execute(
        sa.text(
            f"CREATE TABLE IF NOT EXISTS {LINEAGE_TABLE} (revision varchar(64) PRIMARY KEY, "
            "down_revision varchar(64), backward_compatible boolean NOT NULL)"
        )
    )
    for step in steps:
        conn.execute(
            sa.text(
                f"INSERT INTO {LINEAGE_TABLE} (revision, down_revision, backward_compatible) "
                "VALUES (:r, :d, :c) ON CONFLICT (revision) DO UPDATE SET "
                "down_revision = excluded.down_revision, backward_compatible = excluded.backward_compatible"
            ),
            {"r": step.revision, "d": step.down_revision, "c": step.backward_compatible},
        )


def _stored_lineage(conn: Connection) -> dict[str, LineageStep]:
    if conn.dialect.name != "postgresql":
        return {}
    exists = conn.execute(sa.text("SELECT to_regclass(:t)"), {"t": LINEAGE_TABLE}).scalar()
    if exists is None:
        return {}
    rows = conn.execute(sa.text(f"SELECT revision, down_revision, backward_compatible FROM {LINEAGE_TABLE}"))
    return {r[0]: LineageStep(r[0], r[1], bool(r[2])) for r in rows}


def compatible_newer(conn: Connection, rev: str, our_head: str) -> bool:
    """True if ``rev`` descends from ``our_head`` and every step in between is declared compatible."""
    lineage = _stored_lineage(conn)
    seen: set[str] = set()
    cur: str | None = rev
    while cur is not None and cur != our_head and cur not in seen:
        seen.add(cur)
        step = lineage.get(cur)
        if step is None or not step.backward_compatible:
            return False
        cur = step.down_revision
    return cur == our_head


def _known(rev: str, script_location: Path | None) -> bool:
    scripts = ScriptDirectory.from_config(alembic_config(script_location=script_location))
    return rev in {s.revision for s in scripts.walk_revisions()}


def upgrade(url: str, target: str = "head", script_location: Path | None = None) -> None:
    """Migrate to ``target`` under the migration lock; a no-op on a newer compatible schema."""
    engine = make_engine(url)
    try:
        with engine.begin() as conn:
            postgres = conn.dialect.name == "postgresql"
            if postgres:  # held until this transaction ends: concurrent upgrades run one after another
                conn.execute(sa.text("SELECT pg_advisory_xact_lock(:k)"), {"k": MIGRATION_LOCK_KEY})
            rev = MigrationContext.configure(conn).get_current_revision()
            if rev is not None and not _known(rev, script_location):
                ours = head(script_location)
                if compatible_newer(conn, rev, ours):
                    log.info("database is at %s, a newer schema compatible with %s: nothing to do", rev, ours)
                    return
                raise NewerSchemaError(
                    f"database is at revision {rev}, which this release (head {ours}) does not know "
                    "and which no migration declared compatible: run a newer loraplane"
                )
            cfg = alembic_config(url, script_location)
            cfg.attributes["connection"] = conn
            command.upgrade(cfg, target)
            if postgres:
                _record_lineage(conn, tree_lineage(script_location))
    finally:
        engine.dispose()


def _current_of(engine: Engine) -> str | None:
    with engine.connect() as conn:
        return MigrationContext.configure(conn).get_current_revision()


def current(url: str) -> str | None:
    engine = make_engine(url)
    try:
        return _current_of(engine)
    finally:
        engine.dispose()


def check_schema(engine: Engine) -> None:
    """Refuse to run on a schema that is not at head."""
    try:
        rev = _current_of(engine)
    except Exception as e:
        raise Unavailable(f"cannot read the database schema version: {e}", code="stale_schema") from e
    ours = head()
    if rev == ours:
        return
    if rev is not None and not _known(rev, None):
        with engine.connect() as conn:
            if compatible_newer(conn, rev, ours):
                log.warning(
                    "database schema %s is newer than this release's %s and declared compatible", rev, ours
                )
                return
        raise Unavailable(
            f"database schema {rev} is newer than this release's head {ours} and not declared "
            "compatible: run the newer loraplane release",
            code="stale_schema",
            details={"current": rev, "head": ours},
        )
    raise Unavailable(STALE_MESSAGE, code="stale_schema", details={"current": rev, "head": ours})
