"""Console pages: replicas grid, traffic, audit log (tenants: ``routes_tenants``)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import HTMLResponse, Response

from kit.errors import InvalidRequest, LoraplaneError
from registry.api.deps import AdminState, read
from registry.console.replica_view import placement, residency
from registry.console.stats import sparkline, summarize
from registry.console.web import Viewer, admin, console_of, error_page, render, signed_in
from registry.services import audit as audit_svc

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
PLAN_ROWS = 200  # planned adapter versions shown, busiest first
TRAFFIC_PAGE = 50


@router.get("/replicas", response_class=HTMLResponse)
async def replicas_page(
    request: Request,
    viewer: Annotated[Viewer, Depends(signed_in)],
    st: Annotated[AdminState, Depends(admin)],
    offset: int = 0,
) -> Response:
    """A grid: adapters loaded anywhere (rows, paged) × replicas (columns), with each replica's
    health, running and waiting requests; and the placement plan: per planned adapter version its
    forecast demand, planned replicas and where it is now, per pool the desired replicas."""
    res = await residency(st)
    plan = await placement(st)
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
        "plan": plan,
        "plan_rows": PLAN_ROWS,
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


def _since(value: str | None) -> datetime | None:
    if not value:
        return None
    try:
        ts = datetime.fromisoformat(value)
        # in UTC, as stored: a time whose UTC value is outside years 1..9999 is refused here
        return ts.astimezone(UTC) if ts.tzinfo is not None else ts.replace(tzinfo=UTC)
    except (ValueError, OverflowError):
        raise InvalidRequest(
            "since must be an ISO 8601 time between years 1 and 9999 in UTC", details={"field": "since"}
        ) from None


@router.get("/audit", response_class=HTMLResponse)
def audit_page(
    request: Request,
    viewer: Annotated[Viewer, Depends(signed_in)],
    st: Annotated[AdminState, Depends(admin)],
    action: Opt = None,
    subject_type: Opt = None,
    subject_id: Opt = None,
    since: Opt = None,
    order: Opt = None,
    cursor: Opt = None,
) -> Response:
    """Audit events, newest first (``order=asc``: oldest first, like ``GET /admin/v1/audit``);
    ``since`` defaults to an hour ago."""
    if since is None:
        since = (datetime.now(UTC) - timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M:%SZ")
    params: dict[str, Any] = {
        "action": action or None,
        "subject_type": subject_type or None,
        "subject_id": subject_id or None,
        "since": since,
        "order": "asc" if order == "asc" else None,  # the default (None) is newest first
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
                order=params["order"] or "desc",
            ),
        )
    except LoraplaneError as e:
        return error_page(request, e, viewer)
    ctx = {"page": page, "params": params, "actions": AUDIT_ACTIONS, "subject_types": AUDIT_SUBJECT_TYPES}
    return render(request, "audit.html", ctx, viewer=viewer)
