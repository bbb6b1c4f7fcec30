"""Admin API plumbing: the app's shared state and the one commit point. Who may call what is
declared per route with :func:`registry.auth.dependencies.requires`.

``write(state, fn)`` runs ``fn(session)`` in one transaction through the change writer
(:mod:`registry.writer`: the change feed joins it and hears of it on commit); ``read(state, fn)``
is the read-only counterpart; ``dry(state, fn)`` runs ``fn`` and rolls everything back (a bulk
``dry_run``: the same checks, nothing kept or published).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from fastapi import Request
from sqlalchemy import Engine
from sqlalchemy.orm import Session, sessionmaker

from kit.db import session_scope
from registry.feed import ChangeFeed
from registry.replicas import ReplicaDirectory
from registry.settings import RegistrySettings
from registry.writer import ChangeWriter

T = TypeVar("T")


@dataclass
class AdminState:
    settings: RegistrySettings
    engine: Engine
    factory: sessionmaker[Session]
    store: Any  # registry.storage.base.ArtifactStore | None
    feed: ChangeFeed | None
    replica_directory: ReplicaDirectory | None
    admin_token: str | None


def state_of(request: Request) -> AdminState:
    st: AdminState = request.app.state.admin
    return st


def write(st: AdminState, fn: Callable[[Session], T]) -> T:
    """One change = one transaction (with its audit row and revision bump), then publish
    (:class:`registry.writer.ChangeWriter`, the one commit point of every writer)."""
    return ChangeWriter(st.factory, st.feed)(fn)


def dry(st: AdminState, fn: Callable[[Session], T]) -> T:
    """Run ``fn`` as a change would run, then roll it all back (nothing is published)."""
    session = st.factory()
    try:
        return fn(session)
    finally:
        session.rollback()
        session.close()


def read(st: AdminState, fn: Callable[[Session], T]) -> T:
    """``fn`` in a read-only transaction (on SQLite it does not queue behind a writer)."""
    with session_scope(st.factory, read_only=True) as session:
        return fn(session)
