"""Change feed: tells gateways which registry records changed, so they apply just those.

``ChangeFeed`` (protocol)::

    publish(revision, subjects)  announce a committed revision and what it changed (sync; safe
                                 from any thread)
    listen()                     async iterator of ``Change(revision, subjects)``: first
                                 ``Change(current, {"*"})`` once the subscription is established
                                 (and again after every reconnect), then every newer change in
                                 revision order

A subject is ``adapter:<id>``, ``tenant:<id>``, ``base_model:<name>`` or ``*`` (unknown extent:
reload everything). Listeners must treat a gap in revisions (a notice they never got) like
``*``; the feeds below never invent subjects, they only ever say less (``*``).

Implementations:

- ``InProcessFeed``: one process (``loraplane up``); ``publish`` wakes every listener at once and
  keeps the last ``HISTORY`` changes so a slow listener still gets each one (or a gap).
- ``PostgresNotifyFeed(url, channel)``: ``pg_notify(channel, "<revision> <subject>")`` is sent
  *inside* the change transaction (``registry.repositories.state.bump_revision``, enabled by
  ``bind_session``), so it is delivered exactly when the change commits, in commit order;
  listeners hold a psycopg async connection with ``LISTEN`` and reconnect (re-reading the
  revision, announced as ``*``) on failure.
- ``PollingFeed(session_factory, interval_s)``: reads the revision every ``interval_s`` (SQLite
  shared by several processes; a polled revision is announced as ``*``); ``publish`` in the
  same process wakes listeners at once with the subjects.

Writers use ``bind_feed(session, feed)`` before a change and ``publish_committed(session, feed)``
after the commit (the admin API's request-scoped session does both).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import os
import sqlite3
import threading
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import PurePath
from typing import Any, Protocol

import anyio.to_thread
import psycopg
from psycopg import sql
from sqlalchemy import Engine
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session, sessionmaker

from kit.db import normalize_url, session_scope
from registry.repositories.state import (
    ALL,
    CHANGES_KEY,
    NOTIFIED_KEY,
    NOTIFY_CHANNEL_KEY,
    REVISION_KEY,
    current_revision,
    notice_payload,
    parse_notice,
)

log = logging.getLogger("loraplane.registry.feed")

DEFAULT_CHANNEL = "loraplane_registry"
APPLICATION_NAME = "loraplane-feed"
HISTORY = 4096  # changes an InProcessFeed keeps for listeners that fall behind
EVERYTHING: frozenset[str] = frozenset((ALL,))


@dataclass(frozen=True, slots=True)
class Change:
    """The registry is at ``revision``; ``subjects`` changed in it (``{"*"}``: unknown, reload all)."""

    revision: int
    subjects: frozenset[str] = EVERYTHING

    @property
    def everything(self) -> bool:
        return ALL in self.subjects


class ChangeFeed(Protocol):
    def publish(self, revision: int, subjects: frozenset[str] = EVERYTHING) -> None: ...

    def listen(self) -> AsyncIterator[Change]: ...


def bind_feed(session: Session, feed: ChangeFeed | None) -> None:
    """Let ``feed`` join the session's transaction (PostgreSQL: pg_notify on commit)."""
    if isinstance(feed, PostgresNotifyFeed):
        feed.bind_session(session)


def publish_committed(session: Session, feed: ChangeFeed | None) -> int | None:
    """After a commit: publish the revisions the transaction bumped (unless already notified)."""
    rev = session.info.pop(REVISION_KEY, None)
    notified = session.info.pop(NOTIFIED_KEY, False)
    changes: list[tuple[int, str]] = session.info.pop(CHANGES_KEY, [])
    if rev is not None and feed is not None and not notified:
        by_rev: dict[int, set[str]] = {}
        for r, subject in changes:
            by_rev.setdefault(r, set()).add(subject)
        if not by_rev:
            by_rev[int(rev)] = {ALL}
        for r in sorted(by_rev):
            feed.publish(r, frozenset(by_rev[r]))
    return int(rev) if rev is not None else None


def read_revision(session_factory: sessionmaker[Session]) -> int:
    """The committed revision, read cheaply (SQLite: a plain autocommit SELECT, no write lock)."""
    bind = session_factory.kw.get("bind")
    if isinstance(bind, Engine) and bind.dialect.name == "sqlite":
        raw = bind.raw_connection()
        try:
            cur = raw.cursor()
            cur.execute("SELECT revision FROM registry_state WHERE id = 1")
            row = cur.fetchone()
            cur.close()
            return int(row[0]) if row else 0
        finally:
            raw.close()
    with session_scope(session_factory, read_only=True) as session:
        return current_revision(session)


class InProcessFeed:
    """Listeners in this process, woken by ``publish`` (from any thread).

    The last ``history`` changes are kept, so a listener that was busy gets every change in
    revision order; one that fell further behind sees a gap (and reloads everything).
    """

    def __init__(self, initial_revision: Callable[[], int] | None = None, *, history: int = HISTORY) -> None:
        self._initial = initial_revision
        self._latest = 0
        self._lock = threading.Lock()
        self._history: collections.deque[Change] = collections.deque(maxlen=history)
        self._waiters: set[tuple[asyncio.AbstractEventLoop, asyncio.Event]] = set()

    @property
    def latest(self) -> int:
        return self._latest

    def publish(self, revision: int, subjects: frozenset[str] = EVERYTHING) -> None:
        with self._lock:
            self._latest = max(self._latest, revision)
            self._history.append(Change(revision, frozenset(subjects) or EVERYTHING))
            waiters = list(self._waiters)
        for loop, event in waiters:
            with contextlib.suppress(RuntimeError):  # loop already closed
                loop.call_soon_threadsafe(event.set)

    async def _start_revision(self) -> int:
        if self._initial is not None:
            rev = await anyio.to_thread.run_sync(self._initial)
            with self._lock:
                self._latest = max(self._latest, rev)
        return self._latest

    def _since(self, last: int) -> list[Change]:
        """Changes newer than ``last`` in revision order; ``*`` at the latest if history lost some."""
        with self._lock:
            newer = sorted((c for c in self._history if c.revision > last), key=lambda c: c.revision)
            latest = self._latest
        if latest > last and (not newer or newer[-1].revision < latest):
            newer.append(Change(latest))  # a revision we hold no subjects for (polled, or trimmed)
        return newer

    async def _wait(self, event: asyncio.Event) -> None:
        """Wait until there may be something new."""
        await event.wait()
        event.clear()

    async def listen(self) -> AsyncGenerator[Change, None]:
        event = asyncio.Event()
        entry = (asyncio.get_running_loop(), event)
        with self._lock:
            self._waiters.add(entry)
        try:
            last = await self._start_revision()
            yield Change(last)
            while True:
                await self._wait(event)
                for change in self._since(last):
                    if change.revision > last:
                        last = change.revision
                        yield change
        finally:
            with self._lock:
                self._waiters.discard(entry)


class SqliteChangeProbe:
    """Whether anything was committed to a SQLite file since the last look, by any other
    connection or process: ``PRAGMA data_version`` on a connection of its own (read only).

    Cheap enough for the event loop (no lock wait — ``timeout=0``; in WAL mode it reads the
    shared-memory index). Any error answers "maybe" (``True``) and reopens next time, so the
    caller reads the revision as it would without a probe."""

    def __init__(self, path: str) -> None:
        self._path = path
        self._conn: sqlite3.Connection | None = None
        self._seen: int | None = None

    def changed(self) -> bool:
        try:
            if self._conn is None:
                uri = PurePath(os.path.abspath(self._path)).as_uri() + "?mode=rw"  # never creates a file
                conn = sqlite3.connect(
                    uri, uri=True, timeout=0, isolation_level=None, check_same_thread=False
                )
                conn.execute("PRAGMA query_only = 1")
                self._conn = conn
            (version,) = self._conn.execute("PRAGMA data_version").fetchone()
        except sqlite3.Error:
            self.close()
            return True
        changed = version != self._seen
        self._seen = version
        return changed

    def close(self) -> None:
        conn, self._conn, self._seen = self._conn, None, None
        if conn is not None:
            conn.close()


def _sqlite_file(session_factory: sessionmaker[Session]) -> str | None:
    """The SQLite file behind ``session_factory`` (None for another database or an in-memory one)."""
    bind = session_factory.kw.get("bind")
    if not isinstance(bind, Engine) or bind.dialect.name != "sqlite":
        return None
    db = bind.url.database
    if not db or db == ":memory:" or db.startswith("file:") or bind.url.query:
        return None
    return db


class PollingFeed(InProcessFeed):
    """Polls the database revision every ``interval_s``; in-process publishes wake it at once.

    On a SQLite file a :class:`SqliteChangeProbe` is asked first, on the event loop: the
    revision is read (in a worker thread) only when something was committed since the last poll,
    and at least every ``FULL_READ_S`` whatever the probe says. An idle poll costs one
    ``PRAGMA`` (~7 µs) instead of a thread hop and a query."""

    FULL_READ_S = 1.0

    def __init__(self, session_factory: sessionmaker[Session], interval_s: float = 0.05) -> None:
        self._factory = session_factory
        self.interval_s = max(0.005, float(interval_s))
        path = _sqlite_file(session_factory)
        self._probe = SqliteChangeProbe(path) if path is not None else None
        self._full_read_at = 0.0
        self.reads = 0  # revision reads made by polling (for tests and debugging)
        super().__init__(initial_revision=lambda: read_revision(session_factory))

    async def _wait(self, event: asyncio.Event) -> None:
        # the event, set by an in-process publish or by the poll timer (no wait_for task per poll)
        polled = False

        def poll() -> None:
            nonlocal polled
            polled = True
            event.set()

        timer = asyncio.get_running_loop().call_later(self.interval_s, poll)
        try:
            await event.wait()
        finally:
            timer.cancel()
        event.clear()
        if not polled:
            return  # a publish here: it brought the revision itself
        now = time.monotonic()
        if self._probe is not None and now < self._full_read_at and not self._probe.changed():
            return  # nothing committed since the last look
        self._full_read_at = now + self.FULL_READ_S
        self.reads += 1
        try:
            rev = await anyio.to_thread.run_sync(read_revision, self._factory)
        except Exception as e:
            log.warning("change feed poll failed", extra={"error": str(e)})
            return
        with self._lock:
            self._latest = max(self._latest, rev)


def libpq_dsn(url: str) -> str:
    """A SQLAlchemy PostgreSQL URL as a libpq connection string for psycopg."""
    u = make_url(normalize_url(url)).set(drivername="postgresql")
    return u.render_as_string(hide_password=False)


class PostgresNotifyFeed:
    """LISTEN/NOTIFY on PostgreSQL; notifications are sent inside the change transaction."""

    def __init__(self, url: str, channel: str = DEFAULT_CHANNEL, *, max_backoff_s: float = 5.0) -> None:
        self.dsn = libpq_dsn(url)
        self.channel = channel
        self.max_backoff_s = max_backoff_s

    def bind_session(self, session: Session) -> None:
        session.info[NOTIFY_CHANNEL_KEY] = self.channel

    def publish(self, revision: int, subjects: frozenset[str] = EVERYTHING) -> None:
        """Out-of-transaction announcement (normally not needed: changes notify on commit)."""
        with psycopg.connect(self.dsn, autocommit=True, connect_timeout=5) as conn:
            conn.execute("SELECT pg_notify(%s, %s)", (self.channel, notice_payload(revision, subjects)))

    async def listen(self) -> AsyncGenerator[Change, None]:
        last: int | None = None
        backoff = 0.1
        while True:
            try:
                async with await psycopg.AsyncConnection.connect(
                    self.dsn, autocommit=True, connect_timeout=5, application_name=APPLICATION_NAME
                ) as conn:
                    await conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(self.channel)))
                    cur = await conn.execute("SELECT revision FROM registry_state WHERE id = 1")
                    row = await cur.fetchone()
                    rev = int(row[0]) if row else 0
                    backoff = 0.1
                    if last is None or rev > last:
                        last = rev
                        yield Change(rev)  # what happened while we were not listening is unknown
                    async for note in conn.notifies():
                        try:
                            rev, subjects = parse_notice(note.payload)
                        except ValueError:
                            continue
                        if rev > last:
                            last = rev
                            yield Change(rev, subjects)
            except psycopg.Error as e:
                log.warning(
                    "change feed connection lost; reconnecting", extra={"error": str(e), "backoff_s": backoff}
                )
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, self.max_backoff_s)


def make_feed(settings: Any, engine: Engine, *, kind: str = "auto") -> ChangeFeed:
    """PostgreSQL → ``PostgresNotifyFeed``; SQLite → ``PollingFeed`` (also instant in-process).

    ``kind`` may force ``inprocess``, ``polling`` or ``postgres``.
    """
    from kit.db import make_session_factory

    if kind == "auto":
        kind = "postgres" if engine.dialect.name == "postgresql" else "polling"
    factory = make_session_factory(engine)
    if kind == "postgres":
        return PostgresNotifyFeed(engine.url.render_as_string(hide_password=False))
    if kind == "polling":
        return PollingFeed(factory, float(getattr(settings, "feed_poll_interval_s", 0.05)))
    if kind == "inprocess":
        return InProcessFeed(initial_revision=lambda: read_revision(factory))
    raise ValueError(f"unknown change feed kind {kind!r}")
