"""Database engine and sessions (SQLAlchemy 2, sync).

- ``make_engine(url, timeout_s=...)``: PostgreSQL via psycopg 3 (with ``timeout_s``, no operation
  waits longer, even on a hung server: ``kit.pgconn``), or SQLite made to behave (WAL,
  ``foreign_keys=ON``, busy timeout, ``BEGIN IMMEDIATE`` for every transaction that may write, so
  two writers serialise instead of failing on lock upgrade; a read-only one begins deferred and,
  WAL being what it is, never waits for a writer).
- ``session_scope(factory, read_only=...)``: the one place that commits or rolls back. Services
  and repositories only ``flush()``. ``read_only=True`` is a promise that nothing is written
  (SQLite: a plain ``BEGIN``; PostgreSQL: no difference).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session, sessionmaker

_BEGIN = "loraplane_sqlite_begin"  # execution option: the BEGIN a SQLite transaction starts with
READ_ONLY: dict[str, Any] = {_BEGIN: "BEGIN"}


def normalize_url(url: str) -> str:
    """Use psycopg 3 for plain ``postgresql://`` URLs."""
    if url.startswith("postgresql://") or url.startswith("postgres://"):
        return "postgresql+psycopg://" + url.split("://", 1)[1]
    return url


def make_engine(url: str, *, timeout_s: float | None = None, **kwargs: Any) -> Engine:
    """``timeout_s`` (PostgreSQL; None or 0: unbounded): the most any one database operation may
    take — connecting, a statement, a commit, waiting for a pooled connection — before it fails
    with an ``OperationalError`` (``kit.pgconn``; the admin API's 503 ``database_unavailable``)."""
    url = normalize_url(url)
    u = make_url(url)
    if u.get_backend_name() == "sqlite":
        if u.database and u.database != ":memory:":
            from pathlib import Path

            Path(u.database).parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 30}, **kwargs)
        _make_sqlite_behave(engine)
        return engine
    kwargs.setdefault("pool_pre_ping", True)
    kwargs.setdefault("pool_size", 10)
    kwargs.setdefault("max_overflow", 20)
    if not timeout_s:
        return create_engine(url, **kwargs)
    from kit import pgconn

    options = u.query.get("options")
    kwargs["connect_args"] = {
        **pgconn.connect_args(timeout_s, options if isinstance(options, str) else None),
        **kwargs.get("connect_args", {}),
    }
    kwargs.setdefault("pool_timeout", timeout_s)
    engine = create_engine(url, **kwargs)

    @event.listens_for(engine, "do_connect")
    def _connect(_dialect: Any, _record: Any, cargs: Any, cparams: dict[str, Any]) -> Any:
        return pgconn.connect(timeout_s, cargs, cparams)

    return engine


def _make_sqlite_behave(engine: Engine) -> None:
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        # Let SQLAlchemy, not pysqlite, control transactions, so BEGIN IMMEDIATE below holds.
        dbapi_conn.isolation_level = None
        cur = dbapi_conn.cursor()
        cur.execute("PRAGMA journal_mode=WAL")
        cur.execute("PRAGMA foreign_keys=ON")
        cur.execute("PRAGMA busy_timeout=30000")
        cur.execute("PRAGMA synchronous=NORMAL")
        cur.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Any) -> None:
        # a writer takes the write lock at once (serialised by busy_timeout); a reader reads
        # its WAL snapshot and waits for nobody
        conn.exec_driver_sql(conn.get_execution_options().get(_BEGIN, "BEGIN IMMEDIATE"))


def is_sqlite(engine: Engine) -> bool:
    return engine.dialect.name == "sqlite"


def make_session_factory(engine: Engine) -> sessionmaker[Session]:
    return sessionmaker(bind=engine, expire_on_commit=False, autoflush=False)


@contextmanager
def session_scope(factory: sessionmaker[Session], *, read_only: bool = False) -> Iterator[Session]:
    """Commit on success, roll back on any exception. The only place that commits.
    ``read_only``: the transaction writes nothing (on SQLite it does not queue behind writers)."""
    session = factory()
    try:
        if read_only:
            session.connection(execution_options=READ_ONLY)
        yield session
        session.commit()
    except BaseException:
        session.rollback()
        raise
    finally:
        session.close()
