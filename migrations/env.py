"""Alembic environment: one tree for SQLite (batch mode) and PostgreSQL.

The URL comes from ``config.attributes["connection"]`` (a live connection, used by
``registry.migrate``), else the ``sqlalchemy.url`` option, else ``LORAPLANE_DATABASE_URL``,
else the embedded SQLite default of the registry settings.
"""

from __future__ import annotations

from alembic import context
from sqlalchemy import Connection

import registry.models  # noqa: F401  (registers the tables on the metadata)
from kit.db import make_engine, normalize_url
from kit.orm import Base
from registry.quality import models as quality_models  # noqa: F401  (the quality tables, SPEC §16)

config = context.config
target_metadata = Base.metadata


def _url() -> str:
    url = config.get_main_option("sqlalchemy.url")
    if url:
        return normalize_url(url)
    from registry.settings import RegistrySettings

    return normalize_url(RegistrySettings().resolved_database_url())


def _configure(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        render_as_batch=connection.dialect.name == "sqlite",
        compare_type=True,
    )


def run_migrations_offline() -> None:
    context.configure(
        url=_url(),
        target_metadata=target_metadata,
        literal_binds=True,
        render_as_batch=_url().startswith("sqlite"),
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _configure(connection)
        with context.begin_transaction():
            context.run_migrations()
        return
    engine = make_engine(_url())
    try:
        with engine.connect() as conn:
            _configure(conn)
            with context.begin_transaction():
                context.run_migrations()
            conn.commit()
    finally:
        engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
