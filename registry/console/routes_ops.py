"""Console pages: replicas grid, traffic, tenants (issue a key, shown once), audit log."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Annotated, Any

import anyio.to_thread
from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import HTMLResponse, Response

from kit.errors import InvalidRequest, LoraplaneError
from registry.api.deps import AdminState, read, write
from registry.console.replica_view import residency
from registry.console.stats import sparkline, summarize
from registry.console.web import Viewer, admin, check_csrf, console_of, error_page, render, signed_in
from registry.services import audit as audit_svc
from registry.services import tenants as tenant_svc

router = APIRouter()

Opt = Annotated[str | None, Query()]

# The audit page's filters: every action the product writes — SPEC §13's (``audit_svc.ACTIONS``)
# and those of governance, serving policies, quality and canary analysis (SPEC §14–16) and the
# README's additions — and every subject type it writes (promotion events are about an adapter).
AUDIT_ACTIONS = (
    *audit_svc.ACTIONS,
    "base_model.updated",
    "owner.limits_updated",
    "adapter.fallback",
    "adapter.wrong_adapter",
    "promotion.requested",
    "promotion.approved",
    "promotion.rejected",
    "promotion.executed",
    "version.canary_aborted",
    "regression_set.uploaded",
    "quality_policy.updated",
    "evaluation.started",
    "evaluation.succeeded",
    "evaluation.failed",
    "principal.created",
    "principal.updated",
    "token.issued",
    "token.revoked",
)
AUDIT_SUBJECT_TYPES = ("adapter", "tenant", "base_model", "owner", "principal")
GRID_PAGE = 60
TRAFFIC_PAGE = 50


@router.get("/replicas", response_class=HTMLResponse)
async def replicas_page(
    request: Request,
    viewer: Annotated[Viewer, Depends(signed_in)],
    st: Annotated[AdminState, Depends(admin)],
    offset: int = 0,
) -> Response:
    """A grid: adapters loaded anywhere (rows, paged) × replicas (columns), with each replica's
    health, running and waiting requests."""
    res = await residency(st)
    adapters, cells = res.grid()
    offset = max(0, offset)
    ctx = {
        "res": res,
        "adapters": adapters[offset : offset + GRID_PAGE],
        "cells": cells,
        "offset": offset,
        "more": offset + GRID_PAGE < len(adapters),
        "total": len(adapters),
        "page_size": GRID_PAGE,
    }
    return render(request, "replicas.html", ctx, viewer=viewer)


def _ms(v: float | None) -> str:
    return "–" if v is None else f"{v * 1000:.0f} ms" if v >= 0.01 else f"{v * 1000:.1f} ms"


@router.get("/traffic", response_class=HTMLResponse)
def traffic_page(
    request: Request, viewer: Annotated[Viewer, Depends(signed_in)], offset: int = 0
) -> Response:
    """Per adapter and version over the retained window (at most an hour): requests, errors,
    TTFT and ITL p50/p99, tokens/s, loads and cold-start waits, with small SVG charts; the
    busiest first, 50 rows a page."""
    source = console_of(request).traffic
    window = source.window()
    offset = max(0, offset)
    rows, total = summarize(window, limit=TRAFFIC_PAGE, offset=offset)
    ctx = {
        "rows": rows,
        "total": total,
        "offset": offset,
        "page_size": TRAFFIC_PAGE,
        "source": source.description,
        "window_min": window.seconds / 60,
        "intervals": len(window.intervals),
        "ms": _ms,
        "spark": sparkline,
    }
    return render(request, "traffic.html", ctx, viewer=viewer)


@router.get("/tenants", response_class=HTMLResponse)
def tenants_page(
    request: Request,
    viewer: Annotated[Viewer, Depends(signed_in)],
    st: Annotated[AdminState, Depends(admin)],
    cursor: Opt = None,
) -> Response:
    try:
        page = read(st, lambda s: tenant_svc.list_tenants(s, limit=50, cursor=cursor or None))
    except LoraplaneError as e:
        return error_page(request, e, viewer)
    return render(request, "tenants.html", {"page": page}, viewer=viewer)


@router.get("/tenants/{tenant_id}", response_class=HTMLResponse)
def tenant_page(
    request: Request,
    tenant_id: str,
    viewer: Annotated[Viewer, Depends(signed_in)],
    st: Annotated[AdminState, Depends(admin)],
) -> Response:
    try:
        t = read(st, lambda s: tenant_svc.describe_tenant(s, tenant_id))
    except LoraplaneError as e:
        return error_page(request, e, viewer)
    ctx = {"t": t, "why_key": viewer.reason_not("tenant.write", None)}
    return render(request, "tenant.html", ctx, viewer=viewer)


@router.post("/tenants/{tenant_id}/keys", response_class=HTMLResponse)
async def issue_key(
    request: Request,
    tenant_id: str,
    viewer: Annotated[Viewer, Depends(signed_in)],
    st: Annotated[AdminState, Depends(admin)],
) -> Response:
    """Issue a tenant API key and show it once (this answer is the only place it ever appears)."""
    form = dict(await request.form())
    try:
        check_csrf(viewer, form)
        viewer.require("tenant.write", None)
        issued = await anyio.to_thread.run_sync(
            lambda: write(st, lambda s: tenant_svc.issue_key(s, tenant_id, actor=viewer.id))
        )
    except LoraplaneError as e:
        return error_page(request, e, viewer)
    return render(request, "key_issued.html", {"tenant_id": tenant_id, "issued": issued}, viewer=viewer)


def _since(value: str | None) -> datetime | None:
    if not value:
        return None
    try:
        ts = datetime.fromisoformat(value)
    except ValueError:
        raise InvalidRequest("since must be an ISO 8601 time", details={"field": "since"}) from None
    return ts if ts.tzinfo is not None else ts.replace(tzinfo=UTC)


@router.get("/audit", response_class=HTMLResponse)
def audit_page(
    request: Request,
    viewer: Annotated[Viewer, Depends(signed_in)],
    st: Annotated[AdminState, Depends(admin)],
    action: Opt = None,
    subject_type: Opt = None,
    subject_id: Opt = None,
    since: Opt = None,
    cursor: Opt = None,
) -> Response:
    """Audit events, oldest first like ``GET /admin/v1/audit``; ``since`` defaults to an hour ago."""
    if since is None:
        since = (datetime.now(UTC) - timedelta(hours=1)).replace(microsecond=0).isoformat()
    params: dict[str, Any] = {
        "action": action or None,
        "subject_type": subject_type or None,
        "subject_id": subject_id or None,
        "since": since,
    }
    try:
        when = _since(since)
        page = read(
            st,
            lambda s: audit_svc.list_events(
                s,
                limit=50,
                cursor=cursor or None,
                action=params["action"],
                subject_type=params["subject_type"],
                subject_id=params["subject_id"],
                since=when,
            ),
        )
    except LoraplaneError as e:
        return error_page(request, e, viewer)
    ctx = {"page": page, "params": params, "actions": AUDIT_ACTIONS, "subject_types": AUDIT_SUBJECT_TYPES}
    return render(request, "audit.html", ctx, viewer=viewer)
