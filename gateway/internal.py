"""The gateway's internal port (SPEC §19, ``LORAPLANE_GATEWAY_INTERNAL_PORT``): for Prometheus
and operators, never on the public path.

Routes: ``GET /metrics`` (Prometheus text: per tenant, adapter and version, so it says who uses
which adapter and how much), ``GET /readyz`` (the detailed body of
:func:`gateway.readiness.internal_body`: messages, the routing table's status and last error,
the rate-limit backend) and ``GET /healthz``. The public app (:mod:`gateway.api`) serves
``/v1/*``, ``/healthz``, ``/openapi.json`` and a ``/readyz`` with reason codes only; under
``loraplane up`` (one machine, loopback) it also answers these routes itself (``local=True``).

The app does not start or stop the gateway: the public app's lifespan does.
"""

from __future__ import annotations

import orjson

from gateway.asgi import Receive, Scope, Send, send_bytes
from gateway.errors import GatewayError
from gateway.readiness import internal_body, readiness
from gateway.service import Gateway

PROMETHEUS_TEXT = b"text/plain; version=0.0.4; charset=utf-8"
ROUTES = ("/metrics", "/readyz", "/healthz")


class InternalApp:
    def __init__(self, gateway: Gateway) -> None:
        self.gw = gateway

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            while True:
                msg = await receive()
                if msg["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif msg["type"] == "lifespan.shutdown":
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        if scope["type"] != "http":
            return
        path: str = scope["path"]
        if path not in ROUTES:
            err = GatewayError(404, "not_found", f"no route {path}")
            return await send_bytes(send, err.status, err.body(), [])
        if scope["method"] not in ("GET", "HEAD"):
            err = GatewayError(405, "method_not_allowed", "use GET")
            return await send_bytes(send, err.status, err.body(), [])
        await self.route(path, send, [])

    async def route(self, path: str, send: Send, headers: list[tuple[bytes, bytes]]) -> None:
        """Answer one of :data:`ROUTES` (a GET)."""
        if path == "/metrics":
            await send_bytes(send, 200, self.gw.metrics.render(), headers, PROMETHEUS_TEXT)
        elif path == "/readyz":
            r = await readiness(self.gw)
            await send_bytes(send, r.status, orjson.dumps(internal_body(r)), headers)
        else:
            await send_bytes(send, 200, b'{"status":"ok"}', headers)


def create_internal_app(gateway: Gateway) -> InternalApp:
    """The ASGI app of the internal port (serve it with lifespan off or on: it ignores both)."""
    return InternalApp(gateway)
