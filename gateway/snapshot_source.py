"""How a gateway reads registry changes into its routing table (``gateway.table``).

``make_snapshot_loader(engine)`` → the whole-snapshot loader (PostgreSQL: one statement,
``PostgresSnapshotLoader``, about half the CPU of the ORM read — it runs at start, on a feed
gap or reconnect, when the safety net's revision check finds a lost notice, and every
``verify_s``). ``make_async_snapshot_loader(engine)`` → the same on the event loop, built in
slices of about 2 ms (PostgreSQL; what the gateway uses: a whole load on a thread holds the GIL
in 5 ms turns against the request path, and every socket call of the loop waits for it again).

``make_change_applier(engine)`` → a ``ChangeApplier`` for ``RoutingTable(apply_changes=...)``:

- PostgreSQL: ``PostgresChangeApplier`` keeps one async psycopg connection of its own and reads
  every changed subject's rows in one statement (``registry.services.snapshot.
  apply_changes_pg``) on the event loop: one round trip, no thread hop. On a busy gateway a
  thread that reads through the ORM waits for the GIL at every round trip, which is where most
  of a change's time went (see ``benchmarks/README.md``, propagation). Batches of more than
  ``INLINE_MAX`` subjects are read on a thread instead, so a burst never stalls requests.
- SQLite (``loraplane up``): ``ThreadedChangeApplier``, the same rows through a session on a
  worker thread.

Both also read the registry's revision (``revision()``, one single-row SELECT), which is all
the table's safety net reads every ``refresh_s`` when nothing was missed.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import Any

import psycopg
from sqlalchemy import Engine

from kit.db import make_session_factory, session_scope
from registry.feed import libpq_dsn, read_revision
from registry.repositories.state import current_revision_pg
from registry.services.snapshot import (
    apply_changes,
    apply_changes_pg,
    load_snapshot,
    load_snapshot_pg,
    load_snapshot_pg_async,
)
from registry.snapshot import RoutingSnapshot

APPLICATION_NAME = "loraplane-table"
INLINE_MAX = 64  # subjects read on the event loop; more go to a thread (their records take CPU)


class ThreadedChangeApplier:
    """``apply_changes`` through a session of ``engine``, on a worker thread."""

    def __init__(self, engine: Engine) -> None:
        self._factory = make_session_factory(engine)

    def _apply(
        self, base: RoutingSnapshot, subjects: frozenset[str], revision: int
    ) -> RoutingSnapshot | None:
        with session_scope(self._factory, read_only=True) as session:
            return apply_changes(session, base, subjects, revision)

    async def __call__(
        self, base: RoutingSnapshot, subjects: frozenset[str], revision: int
    ) -> RoutingSnapshot | None:
        return await asyncio.to_thread(self._apply, base, subjects, revision)

    async def revision(self) -> int:
        return await asyncio.to_thread(read_revision, self._factory)

    async def aclose(self) -> None:
        return None


class PostgresChangeApplier:
    """One statement per batch on an async connection of its own (reconnects after an error)."""

    def __init__(self, engine: Engine) -> None:
        self._dsn = libpq_dsn(engine.url.render_as_string(hide_password=False))
        self._threaded = ThreadedChangeApplier(engine)
        self._conn: psycopg.AsyncConnection[Any] | None = None

    async def _connection(self) -> psycopg.AsyncConnection[Any]:
        if self._conn is None or self._conn.closed:
            self._conn = await psycopg.AsyncConnection.connect(
                self._dsn, autocommit=True, connect_timeout=5, application_name=APPLICATION_NAME
            )
        return self._conn

    async def __call__(
        self, base: RoutingSnapshot, subjects: frozenset[str], revision: int
    ) -> RoutingSnapshot | None:
        if len(subjects) > INLINE_MAX:
            return await self._threaded(base, subjects, revision)
        conn = await self._connection()
        try:
            return await apply_changes_pg(conn, base, subjects, revision)
        except psycopg.Error:
            await self.aclose()  # the next batch reconnects; the table reloads meanwhile
            raise

    async def revision(self) -> int:
        conn = await self._connection()
        try:
            return await current_revision_pg(conn)
        except BaseException:  # a failed or cancelled (timed-out) read leaves the connection unusable
            await self.aclose()
            raise

    async def aclose(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(psycopg.Error):
                await conn.close()


class PostgresSnapshotLoader:
    """Whole loads in one statement: ``__call__`` blocking (``load_snapshot_pg``, for a thread),
    ``load_async`` on the event loop, built in slices (``load_snapshot_pg_async``; what a
    gateway uses). A connection per load: loads are rare, and nothing is left open."""

    def __init__(self, engine: Engine) -> None:
        self._dsn = libpq_dsn(engine.url.render_as_string(hide_password=False))

    def __call__(self) -> RoutingSnapshot:
        with psycopg.connect(
            self._dsn, autocommit=True, connect_timeout=5, application_name=APPLICATION_NAME
        ) as conn:
            return load_snapshot_pg(conn)

    async def load_async(self) -> RoutingSnapshot:
        async with await psycopg.AsyncConnection.connect(
            self._dsn, autocommit=True, connect_timeout=5, application_name=APPLICATION_NAME
        ) as conn:
            return await load_snapshot_pg_async(conn)


def make_snapshot_loader(engine: Engine) -> Callable[[], RoutingSnapshot]:
    """PostgreSQL: ``PostgresSnapshotLoader``; else ``load_snapshot`` through a session."""
    if engine.dialect.name == "postgresql":
        return PostgresSnapshotLoader(engine)
    factory = make_session_factory(engine)

    def load() -> RoutingSnapshot:
        with session_scope(factory, read_only=True) as session:
            return load_snapshot(session)

    return load


def make_async_snapshot_loader(engine: Engine) -> Callable[[], Awaitable[RoutingSnapshot]] | None:
    """PostgreSQL: whole loads on the event loop, built in slices; else None (the blocking
    loader on the table's thread)."""
    if engine.dialect.name == "postgresql":
        return PostgresSnapshotLoader(engine).load_async
    return None


def make_change_applier(engine: Engine) -> PostgresChangeApplier | ThreadedChangeApplier:
    if engine.dialect.name == "postgresql":
        return PostgresChangeApplier(engine)
    return ThreadedChangeApplier(engine)
