"""Typed settings of the gateway (the OpenAI-compatible public API). Env prefix ``LORAPLANE_``."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from kit.settings import LoraplaneSettings


class GatewaySettings(LoraplaneSettings):
    """Every field is read from ``LORAPLANE_<FIELD>`` (or the config file named by ``LORAPLANE_CONFIG``)."""

    gateway_host: str = Field(default="127.0.0.1", description="Bind address of the public API.")
    gateway_port: int = Field(default=8080, description="Port of the public API.")
    gateway_internal_host: str = Field(
        default="127.0.0.1",
        description="Bind address of the internal port (`/metrics`, the detailed `/readyz`); keep it "
        "off the public path (containers bind 0.0.0.0 and a NetworkPolicy admits only Prometheus).",
    )
    gateway_internal_port: int | None = Field(
        default=None,
        ge=1,
        le=65535,
        description="Port of `loraplane serve`'s internal listener: `/metrics` (per tenant, adapter and "
        "version), `/readyz` with messages and the routing table's status, `/healthz`. The public port "
        "serves `/v1/*`, `/healthz`, `/openapi.json` and a `/readyz` with reason codes only. Unset: no "
        "metrics are served (a warning at start); the image sets 9464. `loraplane up` (loopback) serves "
        "`/metrics` on its gateway port instead.",
    )
    ratelimit_on_error: Literal["open", "closed"] = Field(
        default="closed",
        description="When Redis (the shared rate-limit store) is unreachable: `closed` answers 503 "
        "`rate_limiter_unavailable`, `open` admits the request without limits. Logged and shown in /readyz.",
    )
    max_body_bytes: int = Field(
        default=8 * 1024 * 1024, description="Largest accepted request body (413 above it)."
    )
    cold_load_queue_cap: int = Field(
        default=64,
        description="Per adapter: most requests allowed to wait for a cold load at once "
        "(503 `no_capacity` with Retry-After beyond it).",
    )
    snapshot_refresh_s: float = Field(
        default=15.0,
        gt=0,
        description="Safety-net period of the routing table: one read of the registry's revision; if "
        "the table is behind it and no change-feed notification brings it there within a second, the "
        "whole snapshot is reloaded. Also the retry period while the registry database is unreachable "
        "(capped at 1 s).",
    )
    snapshot_verify_s: float = Field(
        default=300.0,
        gt=0,
        description="Period of a whole routing-snapshot reload even when the revision matches (repairs and "
        "counts a table that differs from the registry at the same revision, shown as `drifts` in "
        "/readyz); at least snapshot_refresh_s.",
    )
    request_timeout_s: float = Field(
        default=300.0,
        description="Upper bound on waiting for the router to start an answer (placement, load, first "
        "byte); 504 `upstream_timeout` after it.",
    )
    drain_s: float = Field(
        default=30.0,
        ge=0,
        description="On SIGTERM: /readyz fails at once and new requests get 503 `draining`; requests and "
        "streams in flight get this long to finish before the process exits (status 0).",
    )
    default_max_tokens: int = Field(
        default=256,
        description="Completion tokens reserved against the tpm limit at admission when the request "
        "sets no `max_tokens`; corrected with the real usage when the answer ends.",
    )
    chars_per_token: float = Field(
        default=4.0, description="Prompt-token estimate at admission: characters of the prompt / this."
    )
    lease_s: float = Field(
        default=30.0,
        gt=0,
        description="Lease of a concurrency slot in Redis (SPEC §17): the gateway process holding it "
        "renews it every lease_s/3 while the request runs, so a slot of a process that died "
        "(SIGKILL, lost host) frees within lease_s; a live request keeps its slot however long it runs.",
    )
    key_cache_size: int = Field(
        default=10000, description="API keys remembered per registry revision (lookup cache)."
    )
    redis_timeout_s: float = Field(
        default=2.0, description="Timeout of one rate-limit round trip to Redis before on_error applies."
    )
    metrics_tenant_labels: bool = Field(
        default=True, description="Label gateway metrics by tenant (turn off with very many tenants)."
    )
    metrics_series_ttl_s: float = Field(
        default=3600.0,
        ge=0,
        description="Metric label sets of an adapter version (the gateway's request metrics, the "
        "router's loads, unloads, cold waits and fallbacks) are removed from /metrics once none of them "
        "moved for this long (checked every minute); those of a version no longer in the routing table "
        "are removed at the next check either way. 0 = never remove them for idleness.",
    )

    @model_validator(mode="after")
    def _internal_port_differs(self) -> GatewaySettings:
        if self.gateway_internal_port == self.gateway_port:
            raise ValueError(
                f"gateway_internal_port ({self.gateway_internal_port}) must differ from gateway_port: "
                "metrics never share the public port"
            )
        return self
