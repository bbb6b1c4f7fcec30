"""Routes: bulk rollback / disable / enable (SPEC §14). Each selected adapter changes in its own
transaction (committed and published one by one), or with ``dry_run`` in one that is rolled
back: the same checks, nothing kept. A maintainer may use them only when every selected adapter
is in scope (403 otherwise, before anything changes)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Request

from registry.api.deps import AdminState, dry, read, state_of, write
from registry.api.schemas_gov import BulkBody, BulkOut
from registry.api.scopes import SELECTED_ADAPTERS
from registry.auth import Principal
from registry.auth.dependencies import requires
from registry.services import bulk

router = APIRouter(tags=["bulk"])


def _run(st: AdminState, action: str, body: BulkBody, who: Principal) -> BulkOut:
    sel = bulk.parse_selector(body.selector)
    ids = read(st, lambda s: bulk.select(s, sel))
    result = bulk.run(
        action,
        ids,
        run_one=(lambda fn: dry(st, fn)) if body.dry_run else (lambda fn: write(st, fn)),
        actor=who.id,
        reason=body.reason,
        dry_run=body.dry_run,
        read_one=lambda fn: read(st, fn),
    )
    return BulkOut.model_validate(result)


@router.post("/bulk/rollback", response_model=BulkOut)
def bulk_rollback(
    request: Request,
    body: BulkBody,
    who: Annotated[Principal, Depends(requires("adapter.rollback", scope=SELECTED_ADAPTERS))],
) -> BulkOut:
    """Roll back every selected adapter; one without a rollback target fails alone (409
    ``no_rollback_target`` in its result)."""
    return _run(state_of(request), "rollback", body, who)


@router.post("/bulk/disable", response_model=BulkOut)
def bulk_disable(
    request: Request,
    body: BulkBody,
    who: Annotated[Principal, Depends(requires("adapter.disable", scope=SELECTED_ADAPTERS))],
) -> BulkOut:
    """Kill switch on for every selected adapter."""
    return _run(state_of(request), "disable", body, who)


@router.post("/bulk/enable", response_model=BulkOut)
def bulk_enable(
    request: Request,
    body: BulkBody,
    who: Annotated[Principal, Depends(requires("adapter.enable", scope=SELECTED_ADAPTERS))],
) -> BulkOut:
    """Kill switch off for every selected adapter."""
    return _run(state_of(request), "enable", body, who)
