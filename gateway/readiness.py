"""Readiness of a gateway (SPEC §17) and the two ways ``/readyz`` shows it (SPEC §19).

Not ready only when this gateway cannot serve at all: no routing table yet, draining, or the
rate-limit store down with ``ratelimit_on_error=closed``. With no healthy replica it stays ready
(requests get the designed 503 ``no_capacity``), so a load balancer does not drop every gateway
at once.

- :func:`public_body` — the public port's ``/readyz``: §17's fields and reason codes only, no
  error text, no addresses, no backend names (anyone who reaches the public port can read it).
- :func:`internal_body` — the internal port's ``/readyz`` (and ``loraplane up``'s loopback one):
  the same codes plus the human-readable messages, the routing table's whole status (its last
  error included) and the rate-limit backend, for operators.

Reason codes (``reasons``): ``routing_table_not_loaded``, ``draining``,
``ratelimit_store_unreachable`` (listed in both modes; ``ratelimit.on_error`` says whether the
gateway refuses or admits without limits). Warning codes (``warnings``): ``routing_snapshot_stale``
(registry unreachable, serving the last snapshot), ``no_healthy_replica``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gateway.service import Gateway

MESSAGES = {
    "routing_table_not_loaded": "routing table not loaded",
    "draining": "draining: shutting down",
    "routing_snapshot_stale": "registry unreachable: serving a stale routing snapshot",
    "no_healthy_replica": "no healthy replica: requests get 503 no_capacity",
}

# the routing table's fields the public /readyz shows (the rest, last_error included, is internal)
PUBLIC_TABLE_FIELDS = ("loaded", "stale", "revision", "age_s")


@dataclass(frozen=True, slots=True)
class Readiness:
    ready: bool
    reasons: list[str]
    warnings: list[str]
    draining: bool
    replicas_healthy: int
    table: dict[str, Any]
    limiter_backend: str
    limiter_healthy: bool
    on_error: str

    @property
    def status(self) -> int:
        return 200 if self.ready else 503

    def message(self, code: str) -> str:
        if code == "ratelimit_store_unreachable":
            return f"rate-limit store unreachable: ratelimit_on_error={self.on_error} " + (
                "(admitting without limits)" if self.on_error == "open" else "(refusing requests)"
            )
        return MESSAGES.get(code, code)


async def readiness(gw: Gateway) -> Readiness:
    """Check the gateway now (one round trip to the rate-limit store)."""
    table = gw.table.status()
    limiter_ok = await gw.limiter.healthy()
    gw.limiter_failed(not limiter_ok)
    mode = gw.settings.ratelimit_on_error
    healthy = gw.healthy_replicas()
    reasons = []
    if not table["loaded"]:
        reasons.append("routing_table_not_loaded")
    if gw.draining:
        reasons.append("draining")
    if not limiter_ok:
        reasons.append("ratelimit_store_unreachable")
    warnings = []
    if table["stale"]:
        warnings.append("routing_snapshot_stale")
    if healthy == 0:
        warnings.append("no_healthy_replica")
    return Readiness(
        ready=bool(table["loaded"] and not gw.draining and (limiter_ok or mode == "open")),
        reasons=reasons,
        warnings=warnings,
        draining=gw.draining,
        replicas_healthy=healthy,
        table=table,
        limiter_backend=gw.limiter.name,
        limiter_healthy=limiter_ok,
        on_error=mode,
    )


def public_body(r: Readiness) -> dict[str, Any]:
    return {
        "ready": r.ready,
        "reasons": r.reasons,
        "warnings": r.warnings,
        "draining": r.draining,
        "replicas_healthy": r.replicas_healthy,
        "routing_table": {k: r.table.get(k) for k in PUBLIC_TABLE_FIELDS},
        "ratelimit": {"healthy": r.limiter_healthy, "on_error": r.on_error},
    }


def internal_body(r: Readiness) -> dict[str, Any]:
    return {
        **public_body(r),
        "messages": [r.message(c) for c in (*r.reasons, *r.warnings)],
        "routing_table": r.table,
        "ratelimit": {"backend": r.limiter_backend, "healthy": r.limiter_healthy, "on_error": r.on_error},
    }
