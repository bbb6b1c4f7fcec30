"""Which artifact locations the registry still refers to (the orphan sweeper asks)."""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from sqlalchemy.orm import Session

from registry.models import VersionRow


def referenced_storage_uris(session: Session, uris: Sequence[str]) -> set[str]:
    """The subset of ``uris`` that some version row holds as its ``storage_uri``."""
    if not uris:
        return set()
    q = sa.select(VersionRow.storage_uri).where(VersionRow.storage_uri.in_(list(uris))).distinct()
    return set(session.execute(q).scalars())
