"""Console pages: the adapters list, one adapter, and its confirmed state changes."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Annotated, Any

import anyio.to_thread
from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import HTMLResponse, Response

from kit.errors import LoraplaneError
from registry.api.deps import AdminState, read
from registry.console import changes
from registry.console.replica_view import residency
from registry.console.web import Viewer, admin, check_csrf, error_page, redirect, render, signed_in
from registry.services import adapters as adapter_svc
from registry.services import audit as audit_svc
from registry.services import base_models as base_svc
from registry.services import promotions as promo_svc
from registry.services.records import AdapterRecord
from registry.services.rollback_chain import rollback_refusal

router = APIRouter()

PAGE = 50
AUDIT_WINDOW = timedelta(days=7)
AUDIT_SHOWN = 25

Opt = Annotated[str | None, Query()]


def _filters(base_model: str | None, owner: str | None, status: str | None) -> dict[str, str | None]:
    return {"base_model": base_model or None, "owner": owner or None, "status": status or None}


@router.get("/adapters", response_class=HTMLResponse)
async def adapters_page(
    request: Request,
    viewer: Annotated[Viewer, Depends(signed_in)],
    st: Annotated[AdminState, Depends(admin)],
    base_model: Opt = None,
    owner: Opt = None,
    status: Opt = None,
    cursor: Opt = None,
) -> Response:
    """Adapters with their active / canary / hot state and where they are loaded; the table
    refreshes itself every few seconds (htmx) and works without JavaScript."""
    f = _filters(base_model, owner, status)

    def load() -> tuple[Any, list[str]]:
        def q(s: Any) -> tuple[Any, list[str]]:
            page = adapter_svc.list_adapters(s, limit=PAGE, cursor=cursor or None, **f)
            bases = [b.name for b in base_svc.list_base_models(s, limit=500).data]
            return page, bases

        return read(st, q)

    try:
        page, bases = await anyio.to_thread.run_sync(load)
    except LoraplaneError as e:
        return error_page(request, e, viewer)
    res = await residency(st)
    ctx = {
        "page": page,
        "bases": bases,
        "filters": f,
        "cursor": cursor or "",
        "loaded": res.count_by_adapter() if res.ok else None,
        "statuses": adapter_svc.ADAPTER_STATUSES,
    }
    name = "adapters_rows.html" if request.headers.get("HX-Request") else "adapters.html"
    return render(request, name, ctx, viewer=viewer)


@router.get("/adapters/{adapter_id}", response_class=HTMLResponse)
async def adapter_page(
    request: Request,
    adapter_id: str,
    viewer: Annotated[Viewer, Depends(signed_in)],
    st: Annotated[AdminState, Depends(admin)],
    done: Opt = None,
) -> Response:
    since = datetime.now(UTC) - AUDIT_WINDOW

    def load(s: Any) -> tuple[AdapterRecord, list[Any], list[Any]]:
        rec = adapter_svc.describe_adapter(s, adapter_id)
        events = audit_svc.list_events(
            s, limit=500, subject_type="adapter", subject_id=adapter_id, since=since
        ).data
        pending = promo_svc.list_promotions(s, status="pending", adapter_id=adapter_id).data
        return rec, events[-AUDIT_SHOWN:][::-1], pending

    try:
        rec, events, pending = await anyio.to_thread.run_sync(lambda: read(st, load))
    except LoraplaneError as e:
        return error_page(request, e, viewer)
    res = await residency(st)
    owner = rec.owner
    why = {a.name: viewer.reason_not(a.permission, owner) for a in changes.ACTIONS.values()}
    why["rollback"] = why["rollback"] or rollback_refusal(rec)  # refused anyway: say why (SPEC §19)
    ctx = {
        "a": rec,
        "versions": sorted(rec.versions or [], key=lambda v: -int(v.version[1:])),
        "chain": chain_of(rec),
        "events": events,
        "pending": pending,
        "why": why,
        "done": done,
        "placements": res.of_adapter(rec.id) if res.ok else None,
    }
    return render(request, "adapter.html", ctx, viewer=viewer)


def chain_of(rec: AdapterRecord) -> list[dict[str, Any]]:
    """The rollback chain from the active version back (``rollback_to`` links), with x positions
    for the SVG line; the canary (if any) is drawn first, ahead of the active version."""
    by = {v.version: v for v in rec.versions or []}
    out: list[dict[str, Any]] = []
    if rec.canary_version and rec.canary_version in by:
        out.append({"version": rec.canary_version, "status": by[rec.canary_version].status})
    seen: set[str] = set()
    cur = rec.active_version
    while cur is not None and cur in by and cur not in seen and len(seen) < 50:
        seen.add(cur)
        out.append({"version": cur, "status": by[cur].status})
        cur = by[cur].rollback_to
    step = 90
    for i, node in enumerate(out):
        node["x"] = 30 + i * step
    return out


@router.get("/adapters/{adapter_id}/confirm", response_class=HTMLResponse)
async def confirm_page(
    request: Request,
    adapter_id: str,
    viewer: Annotated[Viewer, Depends(signed_in)],
    st: Annotated[AdminState, Depends(admin)],
    action: str = "",
    version: Opt = None,
    weight: Opt = None,
) -> Response:
    """What the change will do, computed by the service itself in a rolled-back transaction."""
    try:
        change = changes.parse(action, adapter_id, version, weight)
        rec = await anyio.to_thread.run_sync(_get, st, adapter_id)
        viewer.require(change.action.permission, rec.owner)
        pv = await anyio.to_thread.run_sync(lambda: changes.preview(st, change, viewer.id))
    except LoraplaneError as e:
        return error_page(request, e, viewer)
    ctx = {"change": change, "preview": pv, "a": pv.before}
    return render(request, "confirm.html", ctx, viewer=viewer, status=pv.error.status if pv.error else 200)


@router.post("/adapters/{adapter_id}/act")
async def act(
    request: Request,
    adapter_id: str,
    viewer: Annotated[Viewer, Depends(signed_in)],
    st: Annotated[AdminState, Depends(admin)],
) -> Response:
    form = dict(await request.form())
    try:
        check_csrf(viewer, form)
        change = changes.parse(
            str(form.get("action", "")), adapter_id, _str(form.get("version")), _str(form.get("weight"))
        )
        rec = await anyio.to_thread.run_sync(_get, st, adapter_id)
        viewer.require(change.action.permission, rec.owner)
        done = await anyio.to_thread.run_sync(lambda: changes.apply(st, change, viewer.id))
    except LoraplaneError as e:
        return error_page(request, e, viewer)
    what = change.action.label + (f" {change.version}" if change.version else "")
    if change.weight is not None:
        what += f" at {change.weight} %"
    if done.promotion is not None:
        p = done.promotion
        return redirect(
            f"/adapters/{adapter_id}",
            done=f"{what}: requested ({p.id}), waiting for {p.approvals_required} approval(s)",
        )
    return redirect(f"/adapters/{adapter_id}", done=f"{what}: done")


def _get(st: AdminState, adapter_id: str) -> AdapterRecord:
    return read(st, lambda s: adapter_svc.get_adapter(s, adapter_id))


def _str(v: Any) -> str | None:
    return v if isinstance(v, str) and v else None
