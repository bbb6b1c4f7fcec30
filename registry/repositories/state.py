"""The single-row registry revision: read it, bump it (inside the change's transaction)."""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.orm import Session

from registry.models import RegistryStateRow

NOTIFY_CHANNEL_KEY = "loraplane_notify_channel"
REVISION_KEY = "loraplane_revision"
NOTIFIED_KEY = "loraplane_notified"


def current_revision(session: Session) -> int:
    rev = session.execute(sa.select(RegistryStateRow.revision).where(RegistryStateRow.id == 1)).scalar()
    return int(rev or 0)


def bump_revision(session: Session) -> int:
    """Increment the revision (row lock held until commit, so revisions commit in order).

    When the session carries a notify channel (PostgreSQL change feed), ``pg_notify`` is sent
    in the same transaction, so listeners hear of it exactly when it commits.
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
        session.execute(sa.select(sa.func.pg_notify(channel, str(rev))))
        session.info[NOTIFIED_KEY] = True
    session.info[REVISION_KEY] = int(rev)
    return int(rev)
