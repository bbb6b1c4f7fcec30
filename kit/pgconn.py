"""PostgreSQL connections that never wait forever (SPEC §18: a hung database answers 503, in bounded time).

A server that hangs (SIGSTOP, a frozen VM, a network path that drops packets silently) keeps its
TCP connections open and its kernel acknowledges what is sent, so neither libpq's TCP settings
nor the server's ``statement_timeout`` ever fire: a statement on such a connection waits
forever. :class:`DeadlineConnection` bounds every operation on an open connection (a statement,
a commit, a rollback, the pool's ping) by ``deadline_s`` on the client side; past it the
connection is closed (its state is unknown) and a :class:`psycopg.OperationalError` raised, which
SQLAlchemy reports as a disconnect (the pool drops the connection) and the admin API as 503
``database_unavailable``. ``connect_timeout`` bounds the connection handshake the same way, and
the server's own ``statement_timeout`` (a little shorter) ends slow statements on a live server.

``engine_args(timeout_s)`` → the ``create_engine`` arguments that set it all up (``kit.db``).
"""

from __future__ import annotations

import math
from typing import Any

import psycopg
from psycopg import errors
from psycopg.abc import RV, PQGen

SERVER_SHARE = 0.8  # statement_timeout, as a share of the client's bound
WAIT_INTERVAL_S = 0.1  # psycopg's own default: how often a wait wakes up for Ctrl-C


class DeadlineConnection(psycopg.Connection[Any]):
    """Every operation on the open connection ends within ``deadline_s`` seconds (None: no bound)."""

    deadline_s: float | None = None

    def wait(self, gen: PQGen[RV], interval: float = WAIT_INTERVAL_S, timeout: float | None = None) -> RV:
        if timeout is None:
            timeout = self.deadline_s
        try:
            return super().wait(gen, interval, timeout)
        except errors._WaitTimeout:  # psycopg's own: the wait ran out of time, nothing else
            self.close()  # mid-protocol: never to be used again
            raise psycopg.OperationalError(
                f"the database did not answer within {timeout:g} s; connection closed"
            ) from None


def connect_args(timeout_s: float, options: str | None = None) -> dict[str, Any]:
    """libpq parameters: the handshake bound (whole seconds, libpq's unit; psycopg's minimum is 2)
    and the server-side ``statement_timeout`` after the URL's own ``options``: a slow statement or
    a lock wait on a live server is cancelled there, at ``SERVER_SHARE`` of the bound, so its
    clean error arrives before the client gives up and the connection stays usable."""
    ours = f"-c statement_timeout={max(1, int(timeout_s * SERVER_SHARE * 1000))}"
    return {
        "connect_timeout": max(2, math.ceil(timeout_s)),
        "options": f"{options} {ours}" if options else ours,
    }


def connect(timeout_s: float, cargs: Any, cparams: dict[str, Any]) -> DeadlineConnection:
    """A :class:`DeadlineConnection` (SQLAlchemy's ``do_connect`` hook)."""
    conn = DeadlineConnection.connect(*cargs, **cparams)
    conn.deadline_s = timeout_s
    return conn
