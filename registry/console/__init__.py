"""The admin console: server-rendered pages (Jinja2) at ``/admin/ui/`` in the admin API process.

``install_console(app)`` adds the pages and ``/admin/ui/static`` to an admin app built by
``registry.api.create_admin_app``; ``set_traffic(app, source)`` gives it the traffic source
(``registry.console.wiring``: ``RingTraffic`` when a gateway runs in the same process, as under
``loraplane up``; ``RedisTraffic`` fed by ``TrafficPublisher`` in separate gateway processes).

Modules: ``web`` (templates, security headers, signed-in viewer, CSRF), ``session`` (signed
cookie), ``routes_auth`` (sign-in/out), ``routes_adapters`` (adapters, adapter, confirmed
changes), ``changes`` (actions and their rolled-back previews), ``routes_ops`` (replicas,
traffic, audit), ``routes_tenants`` (tenants: keys, grants, limits), ``routes_principals``
(principals, the bootstrap one included), ``routes_approvals`` (promotion requests), ``replica_view``,
``traffic``, ``traffic_ring``, ``traffic_redis``, ``wiring`` and ``stats`` (traffic samples and
rows), ``settings`` (``ConsoleSettings``).
Actions call the same ``registry.services`` functions as the admin API's routes.
"""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.responses import Response
from fastapi.staticfiles import StaticFiles

from registry.console import (
    routes_adapters,
    routes_approvals,
    routes_auth,
    routes_ops,
    routes_principals,
    routes_tenants,
)
from registry.console.session import SessionCodec, console_secret
from registry.console.settings import ConsoleSettings
from registry.console.traffic import NoTraffic, TrafficSource
from registry.console.traffic_ring import RingTraffic
from registry.console.web import BASE, HERE, ConsoleState, SignInRequired, redirect

__all__ = ["BASE", "NoTraffic", "RingTraffic", "TrafficSource", "install_console", "set_traffic"]


def install_console(app: FastAPI) -> None:
    settings = ConsoleSettings()
    explicit = settings.console_secret.get_secret_value() if settings.console_secret is not None else None
    app.state.console = ConsoleState(
        codec=SessionCodec(console_secret(explicit, _admin_token(app)), ttl_s=settings.console_session_ttl_s),
        traffic=NoTraffic(),
        secure_cookies=settings.console_secure_cookies,
    )
    pages = (routes_auth, routes_adapters, routes_ops, routes_tenants, routes_principals, routes_approvals)
    for module in pages:
        app.include_router(module.router, prefix=BASE, include_in_schema=False)
    app.mount(BASE + "/static", StaticFiles(directory=str(HERE / "static")), name="console-static")

    async def _sign_in(req: Request, exc: Exception) -> Response:
        assert isinstance(exc, SignInRequired)
        resp = redirect("/signin", next=exc.next_url)
        if req.headers.get("HX-Request"):  # a self-refreshing table: send the whole page to sign in
            return Response(status_code=200, headers={"HX-Redirect": resp.headers["location"]})
        return resp

    app.add_exception_handler(SignInRequired, _sign_in)


def _admin_token(app: FastAPI) -> str | None:
    """The admin token the app was built with (the session secret derives from it)."""
    token: str | None = app.state.admin.admin_token
    return token


def set_traffic(app: FastAPI, source: TrafficSource) -> None:
    app.state.console.traffic = source
