"""Routes: tenants (limits merged key by key on PATCH), API keys, grants."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Body, Depends, Query, Request

from kit.errors import InvalidRequest
from registry.api.deps import read, state_of, write
from registry.api.schemas import (
    GrantOut,
    GrantPut,
    IssuedKeyOut,
    KeyOut,
    TenantCreate,
    TenantDetailOut,
    TenantOut,
    TenantPage,
    TenantPatch,
)
from registry.auth import Principal
from registry.auth.dependencies import requires
from registry.services import tenants as svc

router = APIRouter(tags=["tenants"])

Reader = Annotated[Principal, Depends(requires("read"))]
TenantAdmin = Annotated[Principal, Depends(requires("tenant.write"))]


@router.post("/tenants", status_code=201, response_model=TenantOut)
def create_tenant(request: Request, body: TenantCreate, who: TenantAdmin) -> TenantOut:
    limits = body.limits.model_dump() if body.limits is not None else None
    rec = write(
        state_of(request),
        lambda s: svc.create_tenant(
            s,
            tenant_id=body.id,
            name=body.name,
            limits=limits,
            base_model_access=body.base_model_access,
            actor=who.id,
        ),
    )
    return TenantOut.model_validate(rec)


@router.get("/tenants", response_model=TenantPage)
def list_tenants(
    request: Request,
    who: Reader,
    limit: Annotated[int | None, Query()] = None,
    cursor: Annotated[str | None, Query()] = None,
    adapter_id: Annotated[
        str | None, Query(description="Only the tenants that hold a grant for this adapter.")
    ] = None,
) -> TenantPage:
    """Tenants by id (``adapter_id``: those granted that adapter)."""
    page = read(
        state_of(request), lambda s: svc.list_tenants(s, limit=limit, cursor=cursor, adapter_id=adapter_id)
    )
    return TenantPage(data=[TenantOut.model_validate(r) for r in page.data], next_cursor=page.next_cursor)


@router.get("/tenants/{tenant_id}", response_model=TenantDetailOut)
def describe_tenant(request: Request, tenant_id: str, who: Reader) -> TenantDetailOut:
    return TenantDetailOut.model_validate(
        read(state_of(request), lambda s: svc.describe_tenant(s, tenant_id))
    )


@router.patch("/tenants/{tenant_id}", response_model=TenantOut)
def update_tenant(request: Request, tenant_id: str, body: TenantPatch, who: TenantAdmin) -> TenantOut:
    changes: dict[str, Any] = {}
    for field in body.model_fields_set:
        if field == "limits":
            if body.limits is not None:
                changes["limits"] = {k: getattr(body.limits, k) for k in body.limits.model_fields_set}
        else:
            changes[field] = getattr(body, field)
    if changes.get("name", "") is None or (
        "base_model_access" in changes and changes["base_model_access"] is None
    ):
        raise InvalidRequest("name and base_model_access cannot be null")
    rec = write(state_of(request), lambda s: svc.update_tenant(s, tenant_id, changes, actor=who.id))
    return TenantOut.model_validate(rec)


@router.post("/tenants/{tenant_id}/keys", status_code=201, response_model=IssuedKeyOut)
def issue_key(request: Request, tenant_id: str, who: TenantAdmin) -> IssuedKeyOut:
    """A new API key for the tenant. ``key`` is shown in this answer only; only its hash is stored."""
    return IssuedKeyOut.model_validate(
        write(state_of(request), lambda s: svc.issue_key(s, tenant_id, actor=who.id))
    )


@router.delete("/tenants/{tenant_id}/keys/{key_id}", response_model=KeyOut)
def revoke_key(request: Request, tenant_id: str, key_id: str, who: TenantAdmin) -> KeyOut:
    return KeyOut.model_validate(
        write(state_of(request), lambda s: svc.revoke_key(s, tenant_id, key_id, actor=who.id))
    )


@router.put("/tenants/{tenant_id}/grants/{adapter_id}", response_model=GrantOut)
def put_grant(
    request: Request,
    tenant_id: str,
    adapter_id: str,
    who: TenantAdmin,
    body: Annotated[GrantPut | None, Body()] = None,
) -> GrantOut:
    """Allow the tenant to use the adapter (optional per-grant ``rpm``/``tpm``). 200 whether new or not."""
    rpm = body.rpm if body is not None else None
    tpm = body.tpm if body is not None else None
    rec = write(
        state_of(request),
        lambda s: svc.put_grant(s, tenant_id, adapter_id, rpm=rpm, tpm=tpm, actor=who.id),
    )
    return GrantOut.model_validate(rec)


@router.delete("/tenants/{tenant_id}/grants/{adapter_id}", response_model=GrantOut)
def delete_grant(request: Request, tenant_id: str, adapter_id: str, who: TenantAdmin) -> GrantOut:
    rec = write(state_of(request), lambda s: svc.delete_grant(s, tenant_id, adapter_id, actor=who.id))
    return GrantOut.model_validate(rec)
