"""Format checks on sampled live answers (SPEC §16): the ``json_schema`` and ``regex`` checks of
the adapter's latest regression set (``registry.quality``).

A live answer belongs to no case, so it *conforms* when it passes every format check of at least
one case that has format checks: "answers in one of the formats the regression set expects". An
adapter whose set has no such checks (or no set) runs no format test.
"""

from __future__ import annotations

import json
from typing import Any

from sqlalchemy.orm import Session

from registry.quality import repository as quality_repo

FORMAT_TYPES = ("json_schema", "regex")

FormatGroups = tuple[tuple[str, ...], ...]  # per case, its format checks as canonical JSON


def format_groups(session: Session, adapter_id: str) -> FormatGroups:
    row = quality_repo.latest_set(session, adapter_id)
    if row is None:
        return ()
    groups: dict[tuple[str, ...], None] = {}
    for case in row.cases or []:
        checks = [
            c for c in case.get("checks") or [] if isinstance(c, dict) and c.get("type") in FORMAT_TYPES
        ]
        if checks:
            groups[tuple(sorted(json.dumps(c, sort_keys=True) for c in checks))] = None
    return tuple(groups)


def parse_groups(groups: FormatGroups) -> list[list[dict[str, Any]]]:
    return [[json.loads(c) for c in g] for g in groups]
