"""Fixtures shared by the registry tests (defined in ``core_support``): a migrated SQLite
template and PostgreSQL database, ``db_url`` parametrised over both dialects, ``engine``,
``factory`` and the admin API ``client``."""

from tests.registry.core_support import (  # noqa: F401 - fixtures for every module here
    client,
    db_url,
    engine,
    factory,
    pg_migrated,
    sqlite_template,
)
