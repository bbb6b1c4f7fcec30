"""The single-row registry revision: read it, bump it (inside the change's transaction).

Every bump names the *subject* it changed (``adapter:<id>``, ``tenant:<id>``,
``base_model:<name>``, or ``*`` when the writer cannot say), so gateways can reload just that
subject's rows instead of the whole routing snapshot (``registry.services.snapshot``).
"""

from __future__ import annotations

from typing import Any
from urllib.parse import quote, unquote

import psycopg
import sqlalchemy as sa
from sqlalchemy.orm import Session

from registry.models import RegistryStateRow

NOTIFY_CHANNEL_KEY = "loraplane_notify_channel"
REVISION_KEY = "loraplane_revision"
NOTIFIED_KEY = "loraplane_notified"
CHANGES_KEY = "loraplane_changes"  # session.info: [(revision, subject), …] bumped in this transaction

ALL = "*"  # the subject of a change whose extent is unknown: readers reload everything


def subject(kind: str, ident: str) -> str:
    """``adapter:support`` — the subject string of one registry record."""
    return f"{kind}:{ident}"


def notice_payload(revision: int, subjects: tuple[str, ...] | frozenset[str] | list[str]) -> str:
    """The change feed's message: ``"<revision> <subject> …"``, each subject percent-encoded
    (an owner name may hold spaces)."""
    return " ".join([str(revision), *(quote(s, safe=":*") for s in sorted(subjects))])


def parse_notice(payload: str) -> tuple[int, frozenset[str]]:
    """Inverse of ``notice_payload``; a bare revision (older writers) means ``*``. ValueError if bad."""
    head, *rest = payload.split()
    return int(head), frozenset([unquote(s) for s in rest] or (ALL,))


def current_revision(session: Session) -> int:
    rev = session.execute(sa.select(RegistryStateRow.revision).where(RegistryStateRow.id == 1)).scalar()
    return int(rev or 0)


async def current_revision_pg(conn: psycopg.AsyncConnection[Any]) -> int:
    """``current_revision`` on an async psycopg connection: one primary-key read of one row (the
    gateways' safety net runs it every ``snapshot_refresh_s``)."""
    cur = await conn.execute("SELECT revision FROM registry_state WHERE id = 1")
    row = await cur.fetchone()
    return int(row[0] or 0) if row else 0


def bump_revision(session: Session, subject: str = ALL) -> int:
    """Increment the revision (row lock held until commit, so revisions commit in order).

    ``subject`` names what changed. When the session carries a notify channel (PostgreSQL
    change feed), ``pg_notify`` with ``"<revision> <subject>"`` is sent in the same transaction,
    so listeners hear of it exactly when it commits, in revision order.
    """
    session.flush()
    rev = session.execute(
        sa.update(RegistryStateRow)
        .where(RegistryStateRow.id == 1)
        .values(revision=RegistryStateRow.revision + 1)
        .returning(RegistryStateRow.revision)
    ).scalar()
    if rev is None:  # the seed row is missing (a database not made by our migrations)
        session.add(RegistryStateRow(id=1, revision=1))
        session.flush()
        rev = 1
    channel = session.info.get(NOTIFY_CHANNEL_KEY)
    if channel and session.get_bind().dialect.name == "postgresql":
        session.execute(sa.select(sa.func.pg_notify(channel, notice_payload(int(rev), (subject,)))))
        session.info[NOTIFIED_KEY] = True
    session.info[REVISION_KEY] = int(rev)
    session.info.setdefault(CHANGES_KEY, []).append((int(rev), subject))
    return int(rev)
