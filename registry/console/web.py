"""Console plumbing shared by the page modules: templates, security headers, the signed-in
principal, CSRF checks and the HTML error page.

Every page answers with a ``Content-Security-Policy`` that allows scripts, styles and images
only from this origin (no inline script or style), ``frame-ancestors 'none'`` and
``Cache-Control: no-store``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

from fastapi import Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from fastapi.templating import Jinja2Templates

from kit.errors import Forbidden, LoraplaneError, NotFound
from registry.api.deps import AdminState, read, state_of
from registry.auth import BOOTSTRAP, BOOTSTRAP_ID, Principal
from registry.auth import allowed as _allowed
from registry.auth import missing as _missing
from registry.console.session import COOKIE, ConsoleSession, SessionCodec, same_token
from registry.console.traffic import TrafficSource
from registry.services import principals as principal_svc

BASE = "/admin/ui"
HERE = Path(__file__).parent

CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)
SECURITY_HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
    "Cache-Control": "no-store",
}

templates = Jinja2Templates(directory=str(HERE / "templates"))
templates.env.globals["BASE"] = BASE


@dataclass
class ConsoleState:
    codec: SessionCodec
    traffic: TrafficSource
    secure_cookies: bool = False


def console_of(request: Request) -> ConsoleState:
    cs: ConsoleState = request.app.state.console
    return cs


class SignInRequired(Exception):
    """Raised by :func:`signed_in` when there is no valid session: answered with a redirect."""

    def __init__(self, next_url: str) -> None:
        super().__init__(next_url)
        self.next_url = next_url


@dataclass(frozen=True, slots=True)
class Viewer:
    """The signed-in principal of one request (from the session cookie)."""

    principal: Principal
    session: ConsoleSession

    @property
    def id(self) -> str:
        return self.principal.id

    def reason_not(self, permission: str, owner: str | None) -> str | None:
        """None when allowed, else why not (shown next to a disabled button)."""
        if _allowed(self.principal, permission, owner):
            return None
        return _missing(self.principal, permission, owner)

    def require(self, permission: str, owner: str | None) -> None:
        why = self.reason_not(permission, owner)
        if why is not None:
            raise Forbidden(why, code="forbidden", details={"permission": permission, "owner": owner})


def _current(st: AdminState, sess: ConsoleSession) -> Principal | None:
    """The session's principal as it is now: None when it is gone or its token was revoked."""
    if sess.principal == BOOTSTRAP_ID:  # the cookie's key holds the bootstrap token (session.py)
        return BOOTSTRAP if st.admin_token else None
    try:
        rec = read(st, lambda s: principal_svc.describe_principal(s, sess.principal))
    except NotFound:
        return None
    if not any(t.prefix == sess.token and t.revoked_at is None for t in rec.tokens or []):
        return None
    return Principal(id=rec.id, role=rec.role, owners=tuple(rec.owners))


def signed_in(request: Request) -> Viewer:
    """FastAPI dependency: the viewer, or a redirect to the sign-in page."""
    sess = console_of(request).codec.load(request.cookies.get(COOKIE))
    principal = _current(state_of(request), sess) if sess is not None else None
    if sess is None or principal is None:
        path = request.url.path
        nxt = path + (f"?{request.url.query}" if request.url.query else "")
        raise SignInRequired(nxt if request.method == "GET" else BASE + "/adapters")
    return Viewer(principal, sess)


def check_csrf(viewer: Viewer, form: dict[str, Any]) -> None:
    sent = form.get("csrf")
    if not same_token(sent if isinstance(sent, str) else None, viewer.session.csrf):
        raise Forbidden("missing or wrong CSRF token: reload the page and try again", code="csrf_failed")


def admin(request: Request) -> AdminState:
    return state_of(request)


def render(
    request: Request, name: str, ctx: dict[str, Any], *, status: int = 200, viewer: Viewer | None = None
) -> HTMLResponse:
    context = {"request": request, "viewer": viewer, **ctx}
    if viewer is not None:
        context.setdefault("csrf", viewer.session.csrf)
    resp = templates.TemplateResponse(request, name, context, status_code=status)
    resp.headers.update(SECURITY_HEADERS)
    return resp


def error_page(request: Request, exc: LoraplaneError, viewer: Viewer | None) -> HTMLResponse:
    return render(
        request,
        "error.html",
        {"code": exc.code, "message": exc.message, "status": exc.status},
        status=exc.status,
        viewer=viewer,
    )


def redirect(path: str, **query: Any) -> Response:
    q = {k: v for k, v in query.items() if v not in (None, "")}
    url = BASE + path + (f"?{urlencode(q)}" if q else "")
    resp = RedirectResponse(url, status_code=303)
    resp.headers.update(SECURITY_HEADERS)
    return resp


def query_link(path: str, params: dict[str, Any], **changes: Any) -> str:
    """A link to ``path`` with ``params`` updated by ``changes`` (empty values dropped)."""
    q = {**params, **changes}
    q = {k: v for k, v in q.items() if v not in (None, "")}
    return BASE + path + (f"?{urlencode(q)}" if q else "")


templates.env.globals["query_link"] = query_link
