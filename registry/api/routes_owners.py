"""Routes: owners (SPEC §15) — limits over every adapter of one owner."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Body, Depends, Path, Request

from registry.api.deps import read, state_of, write
from registry.api.schemas import LimitsIn, OwnerOut
from registry.auth import Principal
from registry.auth.dependencies import requires
from registry.services import owners as svc

router = APIRouter(tags=["owners"])

OwnerName = Annotated[str, Path(description="The `owner` string of the adapters (1 to 255 characters).")]


@router.get("/owners/{owner}", response_model=OwnerOut)
def describe_owner(
    request: Request, owner: OwnerName, who: Annotated[Principal, Depends(requires("read"))]
) -> OwnerOut:
    """The owner's limits and the adapters that name it; 404 ``owner_not_found`` when no adapter
    names it and no limits were set."""
    return OwnerOut.model_validate(read(state_of(request), lambda s: svc.describe_owner(s, owner)))


@router.put("/owners/{owner}/limits", response_model=OwnerOut)
def put_owner_limits(
    request: Request,
    owner: OwnerName,
    body: Annotated[LimitsIn, Body()],
    who: Annotated[Principal, Depends(requires("owner.limits"))],
) -> OwnerOut:
    """Set the owner's ``rpm``, ``tpm``, ``max_concurrency`` (a key left out or null = unlimited),
    shared by all its adapters and all tenants. Audited as ``owner.limits_updated``."""
    limits = body.model_dump()
    rec = write(state_of(request), lambda s: svc.put_owner_limits(s, owner, limits, actor=who.id))
    return OwnerOut.model_validate(rec)
