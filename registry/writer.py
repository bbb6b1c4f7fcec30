"""The one commit point of registry changes (DESIGN 24), whoever makes them: the admin API and the
console (``registry.api.deps.write``), bulk operations and approvals (through those), the canary
analyser (abort, auto-promote) and the standalone evaluator.

``ChangeWriter(factory, feed)(fn)`` runs ``fn(session)`` in one transaction
(``kit.db.session_scope``). The services record every change with
``registry.services.audit.record_change`` (audit row + revision bump naming what changed); the
writer makes the change feed join the transaction (``bind_feed``: on PostgreSQL the notice is
sent inside it, so every gateway hears of it exactly when it commits) and, after the commit,
publishes what it bumped (``publish_committed``: the in-process and polling feeds). A writer
without the feed would leave gateways to find the change at their safety-net refresh, seconds
later (SPEC §4: within 1 s).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Protocol, TypeVar

from sqlalchemy.orm import Session, sessionmaker

from kit.db import session_scope
from registry.feed import ChangeFeed, bind_feed, publish_committed

log = logging.getLogger("loraplane.registry.writer")

T = TypeVar("T")


class Transaction(Protocol):
    """Runs ``fn(session)`` in one transaction; a change is announced to the gateways."""

    def __call__(self, fn: Callable[[Session], T]) -> T: ...


class ChangeWriter:
    """:class:`Transaction` on a session factory and the change feed (None: nothing listens)."""

    def __init__(self, factory: sessionmaker[Session], feed: ChangeFeed | None) -> None:
        self.factory = factory
        self.feed = feed

    def __call__(self, fn: Callable[[Session], T]) -> T:
        with session_scope(self.factory) as session:
            bind_feed(session, self.feed)
            out = fn(session)
        try:
            publish_committed(session, self.feed)
        except Exception as e:  # committed: the gateways' safety net still finds it
            log.warning("change feed publish failed", extra={"error": str(e)})
        return out
