"""Alembic migrations of loraplane: one tree that runs on SQLite (batch mode) and PostgreSQL.

Run them with ``loraplane db upgrade`` (or ``registry.migrate.upgrade(url)``); developers can
also use ``alembic -c alembic.ini …`` from the repository root.
"""
