"""Console sign-in and sign-out.

Sign-in takes an admin token: the bootstrap ``LORAPLANE_ADMIN_TOKEN`` (principal ``bootstrap``,
role ``admin``) or a principal's ``lpa-`` token (SPEC §14). The token is checked once and never
stored: the session cookie carries the principal's id, role and owners, signed.
"""

from __future__ import annotations

import secrets
from typing import Annotated

import anyio.to_thread
from fastapi import APIRouter, Depends, Request
from fastapi.responses import HTMLResponse, Response

from kit.errors import Forbidden
from registry.api.deps import AdminState, read
from registry.auth import TOKEN_PREFIX, Principal, authenticate, token_prefix
from registry.console.session import COOKIE, PRE_COOKIE, same_token
from registry.console.web import (
    BASE,
    Viewer,
    admin,
    check_csrf,
    console_of,
    error_page,
    redirect,
    render,
    signed_in,
)

router = APIRouter()


def _safe_next(value: str | None) -> str:
    """Only a path inside the console (no scheme, host or ``//``) is followed after sign-in."""
    if value and value.startswith(BASE + "/") and not value.startswith("//") and "\\" not in value:
        return value
    return BASE + "/adapters"


@router.get("/", include_in_schema=False)
def index() -> Response:
    return redirect("/adapters")


def _signin_form(request: Request, *, next_url: str, error: str | None, status: int = 200) -> Response:
    pre = secrets.token_urlsafe(24)
    resp = render(request, "signin.html", {"next": next_url, "pre": pre, "error": error}, status=status)
    resp.set_cookie(PRE_COOKIE, pre, httponly=True, samesite="strict", path=BASE, max_age=3600)
    return resp


@router.get("/signin", response_class=HTMLResponse)
def signin_page(request: Request, next: str | None = None) -> Response:
    return _signin_form(request, next_url=_safe_next(next), error=None)


def _principal(st: AdminState, token: str) -> Principal | None:
    return read(st, lambda s: authenticate(s, token, bootstrap_token=st.admin_token))


@router.post("/signin", response_class=HTMLResponse)
async def signin(request: Request, st: Annotated[AdminState, Depends(admin)]) -> Response:
    form = await request.form()
    next_url = _safe_next(str(form.get("next") or ""))
    sent = form.get("csrf")
    if not same_token(sent if isinstance(sent, str) else None, request.cookies.get(PRE_COOKIE)):
        return _signin_form(request, next_url=next_url, error="The form expired: sign in again.", status=403)
    token = str(form.get("token") or "").strip()
    principal = await anyio.to_thread.run_sync(lambda: _principal(st, token)) if token else None
    if principal is None:
        return _signin_form(request, next_url=next_url, error="Unknown or revoked token.", status=401)
    cs = console_of(request)
    prefix = token_prefix(token) if token.startswith(TOKEN_PREFIX) else ""
    value, _sess = cs.codec.issue(principal.id, principal.role, tuple(principal.owners), token=prefix)
    resp = redirect(next_url[len(BASE) :])
    resp.set_cookie(
        COOKIE,
        value,
        httponly=True,
        samesite="strict",
        secure=cs.secure_cookies,
        path=BASE,
        max_age=cs.codec.ttl_s,
    )
    resp.delete_cookie(PRE_COOKIE, path=BASE)
    return resp


@router.post("/signout")
async def signout(request: Request, viewer: Annotated[Viewer, Depends(signed_in)]) -> Response:
    form = dict(await request.form())
    try:
        check_csrf(viewer, form)
    except Forbidden as e:
        return error_page(request, e, viewer)
    resp = redirect("/signin")
    resp.delete_cookie(COOKIE, path=BASE)
    return resp
