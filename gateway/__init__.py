"""The OpenAI-compatible public API (SPEC §6, §7, §9, §10, §13).

Public surface::

    from gateway import GatewaySettings, Gateway, build_gateway, create_gateway_app
    gw = build_gateway(settings, router=router, engine=engine, feed=feed)   # or Gateway(...)
    app = create_gateway_app(gw)        # ASGI; lifespan starts/stops router + routing table

Modules: ``api`` (request path: auth → parse → resolve → admit → router.forward → answer),
``auth`` (API key → tenant), ``resolve`` (model string → version), ``ratelimit`` (memory and
Redis limiters), ``table`` (routing snapshot kept fresh from the change feed), ``metrics``,
``settings``, ``errors`` (OpenAI error shape), ``serving`` (uvicorn servers on one loop).
"""

from gateway.api import create_gateway_app
from gateway.build import build_gateway, make_limiter, snapshot_loader
from gateway.service import Gateway
from gateway.settings import GatewaySettings

__all__ = [
    "Gateway",
    "GatewaySettings",
    "build_gateway",
    "create_gateway_app",
    "make_limiter",
    "snapshot_loader",
]
