"""Console page of principals (SPEC §14): who may call the admin API, with which role and owners —
the ``bootstrap`` principal of ``LORAPLANE_ADMIN_TOKEN`` first (the one ``loraplane whoami``
reports after ``loraplane up``; it has no row), then the principals of the registry, by id."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import HTMLResponse, Response

from kit.errors import LoraplaneError
from registry.api.deps import AdminState, read
from registry.auth import BOOTSTRAP
from registry.console.web import Viewer, admin, error_page, render, signed_in
from registry.services import principals as principal_svc
from registry.services.principals import PrincipalRecord

router = APIRouter()


@router.get("/principals", response_class=HTMLResponse)
def principals_page(
    request: Request,
    viewer: Annotated[Viewer, Depends(signed_in)],
    st: Annotated[AdminState, Depends(admin)],
    cursor: Annotated[str | None, Query()] = None,
) -> Response:
    try:
        page = read(st, lambda s: principal_svc.list_principals(s, limit=50, cursor=cursor or None))
    except LoraplaneError as e:
        return error_page(request, e, viewer)
    rows = list(page.data)
    if not cursor and st.admin_token:  # the first page starts with the token-only principal
        rows.insert(0, PrincipalRecord.of_principal(BOOTSTRAP))
    ctx = {"rows": rows, "next_cursor": page.next_cursor, "bootstrap_id": BOOTSTRAP.id}
    return render(request, "principals.html", ctx, viewer=viewer)
