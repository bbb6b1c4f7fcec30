"""Schema migrations: upgrade, current revision, head, and the stale-schema guard.

The Alembic ``Config`` is built in code with ``script_location`` pointing at the installed
``migrations`` package, so it works from any working directory and from a wheel.

- ``upgrade(url)``: migrate the database at ``url`` to head.
- ``current(url)``: its revision, or None for an empty database.
- ``head()``: the head revision of the tree.
- ``check_schema(engine)``: raise ``Unavailable(code="stale_schema")`` unless at head; the
  admin API and every service call it at start.
"""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Engine

import migrations
from kit.db import make_engine, normalize_url
from kit.errors import Unavailable

STALE_MESSAGE = "database schema is not at head: run `loraplane db upgrade`"


def alembic_config(url: str | None = None) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(Path(migrations.__file__).parent))
    if url:
        cfg.set_main_option("sqlalchemy.url", normalize_url(url).replace("%", "%%"))
    return cfg


def head() -> str:
    heads = ScriptDirectory.from_config(alembic_config()).get_heads()
    if len(heads) != 1:
        raise RuntimeError(f"migration tree must have exactly one head, found {heads}")
    return heads[0]


def upgrade(url: str, target: str = "head") -> None:
    engine = make_engine(url)
    try:
        with engine.begin() as conn:
            cfg = alembic_config(url)
            cfg.attributes["connection"] = conn
            command.upgrade(cfg, target)
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
    if rev != head():
        raise Unavailable(STALE_MESSAGE, code="stale_schema", details={"current": rev, "head": head()})
