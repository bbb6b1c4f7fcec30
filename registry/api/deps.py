"""Admin API plumbing: the app's shared state, admin-token auth, and the one commit point.

``write(state, fn)`` runs ``fn(session)`` in one transaction (``kit.db.session_scope``) that the
change feed joins (``bind_feed``: PostgreSQL notifies on commit) and publishes after the commit
(``publish_committed``); ``read(state, fn)`` is the read-only counterpart.
"""

from __future__ import annotations

import hmac
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy import Engine
from sqlalchemy.orm import Session, sessionmaker

from kit.db import session_scope
from kit.errors import Unauthorized
from registry.feed import ChangeFeed, bind_feed, publish_committed
from registry.replicas import ReplicaDirectory
from registry.settings import RegistrySettings

log = logging.getLogger("loraplane.registry.api")

T = TypeVar("T")

ADMIN_ACTOR = "admin"


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


_bearer = HTTPBearer(auto_error=False, description="The admin token (LORAPLANE_ADMIN_TOKEN).")


def require_admin(
    request: Request, credentials: HTTPAuthorizationCredentials | None = Depends(_bearer)
) -> str:
    """Constant-time comparison of the bearer token with the admin token; returns the actor."""
    token = state_of(request).admin_token
    if credentials is None or not credentials.credentials:
        raise Unauthorized("missing bearer token")
    if token is None or not hmac.compare_digest(credentials.credentials.encode(), token.encode()):
        raise Unauthorized("invalid admin token")
    return ADMIN_ACTOR


def write(st: AdminState, fn: Callable[[Session], T]) -> T:
    """One change = one transaction (with its audit row and revision bump), then publish."""
    with session_scope(st.factory) as session:
        bind_feed(session, st.feed)
        out = fn(session)
    try:
        publish_committed(session, st.feed)
    except Exception as e:
        log.warning("change feed publish failed", extra={"error": str(e)})
    return out


def read(st: AdminState, fn: Callable[[Session], T]) -> T:
    with session_scope(st.factory) as session:
        return fn(session)
