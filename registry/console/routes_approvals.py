"""Console page: the approvals inbox (SPEC §14 promotion requests) with approve / reject.

Approve and reject call ``registry.services.promotions`` as ``POST /admin/v1/promotions/{id}/…``
does: a principal never approves its own request nor one for a version whose quality gate it
recorded by hand (the button says so), a forced request is marked so, an approval that reaches
the number required runs the promotion in the same transaction, and a request found expired or
stale is written so and the page says why.
"""

from __future__ import annotations

from typing import Annotated, Any

import anyio.to_thread
from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import HTMLResponse, Response

from kit.errors import LoraplaneError
from registry.api.deps import AdminState, read, write
from registry.auth import PLATFORM_ACTORS
from registry.console.web import Viewer, admin, check_csrf, error_page, redirect, render, signed_in
from registry.services import adapters as adapter_svc
from registry.services import promotions as promo_svc
from registry.services.promotions import PromotionRecord

router = APIRouter()

Opt = Annotated[str | None, Query()]


def _why(
    viewer: Viewer, p: PromotionRecord, owner: str | None, permission: str, gate_by: str | None
) -> str | None:
    if p.status != "pending":
        return f"the request is {p.status}"
    if permission == "promotion.approve" and p.requested_by == viewer.id:
        return "you requested this promotion: another approver must approve it"
    if permission == "promotion.approve" and gate_by == viewer.id and gate_by not in PLATFORM_ACTORS:
        return f"you recorded the quality gate of {p.version} by hand: another approver must approve it"
    if permission == "promotion.approve" and any(a.principal == viewer.id for a in p.approvals):
        return "you already approved it"
    return viewer.reason_not(permission, owner)


@router.get("/approvals", response_class=HTMLResponse)
def approvals_page(
    request: Request,
    viewer: Annotated[Viewer, Depends(signed_in)],
    st: Annotated[AdminState, Depends(admin)],
    status: Opt = "pending",
    adapter_id: Opt = None,
    cursor: Opt = None,
    done: Opt = None,
) -> Response:
    def load(s: Any) -> tuple[Any, dict[str, str | None], dict[tuple[str, str], str | None]]:
        page = promo_svc.list_promotions(
            s, limit=50, cursor=cursor or None, status=status or None, adapter_id=adapter_id or None
        )
        owners: dict[str, str | None] = {}
        gate_by: dict[tuple[str, str], str | None] = {}  # who recorded each version's gate
        for p in page.data:
            if p.adapter_id not in owners:
                owners[p.adapter_id] = adapter_svc.get_adapter(s, p.adapter_id).owner
            if p.status == "pending" and (p.adapter_id, p.version) not in gate_by:
                gate_by[(p.adapter_id, p.version)] = adapter_svc.get_version(
                    s, p.adapter_id, p.version
                ).quality_gate_by
        return page, owners, gate_by

    try:
        page, owners, gate_by = read(st, load)
    except LoraplaneError as e:
        return error_page(request, e, viewer)
    rows = []
    for p in page.data:
        owner, setter = owners.get(p.adapter_id), gate_by.get((p.adapter_id, p.version))
        rows.append(
            {
                "p": p,
                "owner": owner,
                "why_approve": _why(viewer, p, owner, "promotion.approve", setter),
                "why_reject": _why(viewer, p, owner, "promotion.reject", None),
            }
        )
    params = {"status": status or "", "adapter_id": adapter_id or None}
    ctx = {"rows": rows, "page": page, "params": params, "statuses": promo_svc.STATUSES, "done": done}
    return render(request, "approvals.html", ctx, viewer=viewer)


@router.post("/approvals/{promotion_id}/{decision}")
async def decide(
    request: Request,
    promotion_id: str,
    decision: str,
    viewer: Annotated[Viewer, Depends(signed_in)],
    st: Annotated[AdminState, Depends(admin)],
) -> Response:
    form = dict(await request.form())
    comment = form.get("comment")
    note = comment.strip() if isinstance(comment, str) and comment.strip() else None
    try:
        check_csrf(viewer, form)
        if decision not in ("approve", "reject"):
            return error_page(
                request, LoraplaneError("unknown decision", code="not_found", status=404), viewer
            )
        permission = f"promotion.{decision}"

        def run(s: Any) -> promo_svc.Outcome:
            p = promo_svc.get_promotion(s, promotion_id)
            viewer.require(permission, adapter_svc.get_adapter(s, p.adapter_id).owner)
            fn = promo_svc.approve if decision == "approve" else promo_svc.reject
            return fn(s, promotion_id, viewer.principal, comment=note)

        out = await anyio.to_thread.run_sync(lambda: write(st, run))
    except LoraplaneError as e:
        return error_page(request, e, viewer)
    if out.error is not None:
        return error_page(request, out.error, viewer)
    assert out.promotion is not None
    return redirect("/approvals", status="", done=f"{promotion_id}: {out.promotion.status}")
