"""Routes: principals and their tokens, ``/whoami``, promotion requests (SPEC §14)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Body, Depends, Query, Request

from kit.errors import InvalidRequest
from registry.api.deps import read, state_of, write
from registry.api.schemas_gov import (
    DecisionBody,
    IssuedTokenOut,
    PrincipalCreate,
    PrincipalDetailOut,
    PrincipalOut,
    PrincipalPage,
    PrincipalPatch,
    PromotionOut,
    PromotionPage,
    TokenOut,
)
from registry.api.scopes import OWNER_OF_PROMOTION
from registry.auth import BOOTSTRAP_ID, Principal
from registry.auth.dependencies import requires
from registry.services import principals as svc
from registry.services import promotions as promo_svc
from registry.services.principals import PrincipalRecord

router = APIRouter()

Limit = Annotated[int | None, Query(description="Page size (default 50, at most 500).")]
Cursor = Annotated[str | None, Query(description="Opaque cursor from the previous page's next_cursor.")]
Reader = Annotated[Principal, Depends(requires("read"))]
PrincipalAdmin = Annotated[Principal, Depends(requires("principal.write"))]


@router.get("/whoami", response_model=PrincipalOut, tags=["principals"])
def whoami(request: Request, who: Annotated[Principal, Depends(requires(None))]) -> PrincipalOut:
    """The caller's principal record (``bootstrap`` for LORAPLANE_ADMIN_TOKEN)."""
    if who.id == BOOTSTRAP_ID:
        return PrincipalOut.model_validate(PrincipalRecord.of_principal(who))
    return PrincipalOut.model_validate(read(state_of(request), lambda s: svc.describe_principal(s, who.id)))


@router.post("/principals", status_code=201, response_model=PrincipalOut, tags=["principals"])
def create_principal(request: Request, body: PrincipalCreate, who: PrincipalAdmin) -> PrincipalOut:
    rec = write(
        state_of(request),
        lambda s: svc.create_principal(
            s, principal_id=body.id, role=body.role, owners=body.owners, actor=who.id
        ),
    )
    return PrincipalOut.model_validate(rec)


@router.get("/principals", response_model=PrincipalPage, tags=["principals"])
def list_principals(
    request: Request, who: Reader, limit: Limit = None, cursor: Cursor = None
) -> PrincipalPage:
    page = read(state_of(request), lambda s: svc.list_principals(s, limit=limit, cursor=cursor))
    return PrincipalPage(
        data=[PrincipalOut.model_validate(r) for r in page.data], next_cursor=page.next_cursor
    )


@router.get("/principals/{principal_id}", response_model=PrincipalDetailOut, tags=["principals"])
def describe_principal(request: Request, principal_id: str, who: Reader) -> PrincipalDetailOut:
    """With its tokens (prefix and dates; never a token itself)."""
    return PrincipalDetailOut.model_validate(
        read(state_of(request), lambda s: svc.describe_principal(s, principal_id))
    )


@router.patch("/principals/{principal_id}", response_model=PrincipalDetailOut, tags=["principals"])
def update_principal(
    request: Request, principal_id: str, body: PrincipalPatch, who: PrincipalAdmin
) -> PrincipalDetailOut:
    """Change ``role`` and/or ``owners``; takes effect on the principal's next call."""
    changes: dict[str, Any] = {f: getattr(body, f) for f in body.model_fields_set}
    if changes.get("role", "") is None:
        raise InvalidRequest("role cannot be null", details={"field": "role"})
    rec = write(state_of(request), lambda s: svc.update_principal(s, principal_id, changes, actor=who.id))
    return PrincipalDetailOut.model_validate(rec)


@router.post(
    "/principals/{principal_id}/tokens", status_code=201, response_model=IssuedTokenOut, tags=["principals"]
)
def issue_token(request: Request, principal_id: str, who: PrincipalAdmin) -> IssuedTokenOut:
    """A new ``lpa-…`` token, shown in this answer only."""
    return IssuedTokenOut.model_validate(
        write(state_of(request), lambda s: svc.issue_token(s, principal_id, actor=who.id))
    )


@router.delete("/principals/{principal_id}/tokens/{token_id}", response_model=TokenOut, tags=["principals"])
def revoke_token(request: Request, principal_id: str, token_id: str, who: PrincipalAdmin) -> TokenOut:
    """Revoked at once: the next call with it answers 401."""
    return TokenOut.model_validate(
        write(state_of(request), lambda s: svc.revoke_token(s, principal_id, token_id, actor=who.id))
    )


# --------------------------------------------------------------------------- promotion requests


@router.get("/promotions", response_model=PromotionPage, tags=["promotions"])
def list_promotions(
    request: Request,
    who: Reader,
    limit: Limit = None,
    cursor: Cursor = None,
    status: str | None = None,
    adapter_id: str | None = None,
) -> PromotionPage:
    """Oldest first; filters ``status`` (pending, executed, rejected, expired, stale) and
    ``adapter_id``."""
    page = read(
        state_of(request),
        lambda s: promo_svc.list_promotions(
            s, limit=limit, cursor=cursor, status=status, adapter_id=adapter_id
        ),
    )
    return PromotionPage(
        data=[PromotionOut.model_validate(r) for r in page.data], next_cursor=page.next_cursor
    )


@router.get("/promotions/{promotion_id}", response_model=PromotionOut, tags=["promotions"])
def get_promotion(request: Request, promotion_id: str, who: Reader) -> PromotionOut:
    return PromotionOut.model_validate(
        read(state_of(request), lambda s: promo_svc.get_promotion(s, promotion_id))
    )


@router.post("/promotions/{promotion_id}/approve", response_model=PromotionOut, tags=["promotions"])
def approve(
    request: Request,
    promotion_id: str,
    who: Annotated[Principal, Depends(requires("promotion.approve", scope=OWNER_OF_PROMOTION))],
    body: Annotated[DecisionBody | None, Body()] = None,
) -> PromotionOut:
    """Add the caller's approval (never the requester's own: 403 ``self_approval``). When the
    approvals reach the number required, the promotion runs now (quality gate checked again) and
    the request answers ``executed``. 409 ``promotion_stale`` / ``promotion_expired`` /
    ``promotion_not_pending`` / ``already_approved``."""
    comment = body.comment if body is not None else None
    out = write(state_of(request), lambda s: promo_svc.approve(s, promotion_id, who, comment=comment))
    if out.error is not None:
        raise out.error
    return PromotionOut.model_validate(out.promotion)


@router.post("/promotions/{promotion_id}/reject", response_model=PromotionOut, tags=["promotions"])
def reject(
    request: Request,
    promotion_id: str,
    who: Annotated[Principal, Depends(requires("promotion.reject", scope=OWNER_OF_PROMOTION))],
    body: Annotated[DecisionBody | None, Body()] = None,
) -> PromotionOut:
    comment = body.comment if body is not None else None
    out = write(state_of(request), lambda s: promo_svc.reject(s, promotion_id, who, comment=comment))
    if out.error is not None:
        raise out.error
    return PromotionOut.model_validate(out.promotion)
