"""Console pages of tenants: the list, one tenant, and what an admin does there — issue a key
(shown once), revoke a key, grant and revoke adapters, change limits and base-model access.

Every change calls the same ``registry.services.tenants`` function as the admin API route,
through ``registry.api.deps.write`` (one transaction with its audit event, then the change
notice to the gateways). Revoking a key or a grant, which cuts a client off at once, goes through
a confirmation page that says so; the POST checks CSRF and ``tenant.write`` again. Bad form values
answer the error page with 422, never a 500.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any, TypeVar

import anyio.to_thread
from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import HTMLResponse, Response

from kit.errors import InvalidRequest, LoraplaneError
from kit.inputs import INT32_MAX, text_problem
from registry.api.deps import AdminState, read, write
from registry.console.web import Viewer, admin, check_csrf, error_page, redirect, render, signed_in
from registry.services import adapters as adapter_svc
from registry.services import tenants as tenant_svc

router = APIRouter()

Opt = Annotated[str | None, Query()]
T = TypeVar("T")

LIMIT_FIELDS = (
    ("rpm", "Requests per minute"),
    ("tpm", "Tokens per minute"),
    ("max_concurrency", "Max concurrency"),
    ("max_cold_waiters", "Max cold waiters"),
)
ADAPTER_CHOICES = 500  # the grant form offers this many adapter ids (any id can be typed)


def _form_int(form: dict[str, Any], name: str) -> int | None:
    """A limit from a form field: empty → None (unlimited), else an integer in [0, 2³¹−1]."""
    raw = form.get(name)
    if raw is None or (isinstance(raw, str) and not raw.strip()):
        return None
    if not isinstance(raw, str) or not raw.strip().isdigit():
        raise InvalidRequest(
            f"{name} must be a whole number ≥ 0, or empty for unlimited", details={"field": name}
        )
    value = int(raw.strip())
    if value > INT32_MAX:
        raise InvalidRequest(f"{name} must be at most {INT32_MAX}", details={"field": name})
    return value


def _form_id(form: dict[str, Any], name: str) -> str:
    raw = form.get(name)
    if not isinstance(raw, str) or not raw.strip() or text_problem(raw) is not None:
        raise InvalidRequest(f"{name} is required", details={"field": name})
    return raw.strip()


async def _change(st: AdminState, fn: Callable[[Any], T]) -> T:
    return await anyio.to_thread.run_sync(lambda: write(st, fn))


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
    done: Opt = None,
) -> Response:
    def load(s: Any) -> tuple[Any, list[str]]:
        t = tenant_svc.describe_tenant(s, tenant_id)
        ids = [a.id for a in adapter_svc.list_adapters(s, limit=ADAPTER_CHOICES).data]
        return t, ids

    try:
        t, adapter_ids = read(st, load)
    except LoraplaneError as e:
        return error_page(request, e, viewer)
    granted = {g.adapter_id for g in t.grants or []}
    ctx = {
        "t": t,
        "why_key": viewer.reason_not("tenant.write", None),
        "done": done,
        "limit_fields": LIMIT_FIELDS,
        "grantable": [a for a in adapter_ids if a not in granted],
    }
    return render(request, "tenant.html", ctx, viewer=viewer)


async def _form(request: Request, viewer: Viewer) -> dict[str, Any]:
    form = dict(await request.form())
    check_csrf(viewer, form)
    viewer.require("tenant.write", None)
    return form


@router.post("/tenants/{tenant_id}/keys", response_class=HTMLResponse)
async def issue_key(
    request: Request,
    tenant_id: str,
    viewer: Annotated[Viewer, Depends(signed_in)],
    st: Annotated[AdminState, Depends(admin)],
) -> Response:
    """Issue a tenant API key and show it once (this answer is the only place it ever appears)."""
    try:
        await _form(request, viewer)
        issued = await _change(st, lambda s: tenant_svc.issue_key(s, tenant_id, actor=viewer.id))
    except LoraplaneError as e:
        return error_page(request, e, viewer)
    return render(request, "key_issued.html", {"tenant_id": tenant_id, "issued": issued}, viewer=viewer)


@router.get("/tenants/{tenant_id}/confirm", response_class=HTMLResponse)
def confirm_page(
    request: Request,
    tenant_id: str,
    viewer: Annotated[Viewer, Depends(signed_in)],
    st: Annotated[AdminState, Depends(admin)],
    action: str = "",
    key_id: Opt = None,
    adapter_id: Opt = None,
) -> Response:
    """What revoking a key or a grant will do, before it is done."""
    try:
        viewer.require("tenant.write", None)
        t = read(st, lambda s: tenant_svc.describe_tenant(s, tenant_id))
        if action == "revoke_key":
            key = next((k for k in t.keys or [] if k.key_id == key_id and k.revoked_at is None), None)
            if key is None:
                raise InvalidRequest(
                    f"tenant {tenant_id!r} has no live key {key_id!r}", details={"field": "key_id"}
                )
            what = f"Revoke key {key.prefix}… ({key.key_id})"
            lines = [
                "Requests with this key get 401 at once, on every gateway; "
                f"{tenant_id}'s other keys keep working."
            ]
            fields = {"key_id": key.key_id}
        elif action == "revoke_grant":
            if adapter_id not in {g.adapter_id for g in t.grants or []}:
                raise InvalidRequest(
                    f"tenant {tenant_id!r} has no grant for {adapter_id!r}", details={"field": "adapter_id"}
                )
            what = f"Revoke the grant of {adapter_id}"
            lines = [
                f"{tenant_id}'s requests for {adapter_id} get 404 model_not_found at once, on every gateway."
            ]
            fields = {"adapter_id": str(adapter_id)}
        else:
            raise InvalidRequest("action must be revoke_key or revoke_grant", details={"field": "action"})
    except LoraplaneError as e:
        return error_page(request, e, viewer)
    ctx = {"t": t, "action": action, "what": what, "lines": lines, "fields": fields}
    return render(request, "tenant_confirm.html", ctx, viewer=viewer)


@router.post("/tenants/{tenant_id}/act")
async def act(
    request: Request,
    tenant_id: str,
    viewer: Annotated[Viewer, Depends(signed_in)],
    st: Annotated[AdminState, Depends(admin)],
) -> Response:
    """Apply one change: ``revoke_key``, ``revoke_grant``, ``grant`` or ``limits``."""
    try:
        form = await _form(request, viewer)
        action = form.get("action")
        if action == "revoke_key":
            key_id = _form_id(form, "key_id")
            rec = await _change(st, lambda s: tenant_svc.revoke_key(s, tenant_id, key_id, actor=viewer.id))
            done = f"key {rec.prefix}… revoked"
        elif action == "revoke_grant":
            adapter_id = _form_id(form, "adapter_id")
            await _change(st, lambda s: tenant_svc.delete_grant(s, tenant_id, adapter_id, actor=viewer.id))
            done = f"grant of {adapter_id} revoked"
        elif action == "grant":
            adapter_id = _form_id(form, "adapter_id")
            rpm, tpm = _form_int(form, "rpm"), _form_int(form, "tpm")
            await _change(
                st,
                lambda s: tenant_svc.put_grant(s, tenant_id, adapter_id, rpm=rpm, tpm=tpm, actor=viewer.id),
            )
            done = f"{adapter_id} granted"
        elif action == "limits":
            limits = {name: _form_int(form, name) for name, _ in LIMIT_FIELDS}
            changes = {"limits": limits, "base_model_access": form.get("base_model_access") == "on"}
            await _change(st, lambda s: tenant_svc.update_tenant(s, tenant_id, changes, actor=viewer.id))
            done = "limits saved"
        else:
            raise InvalidRequest("unknown action", details={"field": "action"})
    except LoraplaneError as e:
        return error_page(request, e, viewer)
    return redirect(f"/tenants/{tenant_id}", done=done)
