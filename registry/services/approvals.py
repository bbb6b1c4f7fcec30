"""``approvals_required`` (SPEC §14): its check, and the number that applies to an adapter (its
own when set, else its base model's)."""

from __future__ import annotations

from typing import Any

from sqlalchemy.orm import Session

from kit.errors import InvalidRequest
from registry.models import AdapterRow
from registry.repositories import base_models as base_repo

MAX_APPROVALS = 100


def check_approvals_required(value: Any, *, nullable: bool = False) -> Any:
    if value is None and nullable:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_APPROVALS:
        raise InvalidRequest(
            f"approvals_required must be an integer from 0 to {MAX_APPROVALS}",
            details={"field": "approvals_required"},
        )
    return value


def approvals_required(session: Session, adapter: AdapterRow) -> int:
    if adapter.approvals_required is not None:
        return int(adapter.approvals_required)
    base = base_repo.get(session, adapter.base_model)
    return int(base.approvals_required) if base is not None else 0
