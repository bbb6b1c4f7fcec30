"""Prometheus metrics of the gateway, per tenant, adapter and version (SPEC §9).

``GatewayMetrics(registry=None)`` uses its own ``CollectorRegistry`` (several apps in one test
process must not collide); ``/metrics`` renders it together with the default registry (where
the router records loads, placements and replica health). ``snapshot_age`` (the routing table's
``age_s``) becomes ``loraplane_snapshot_age_seconds``, read at scrape time.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram, generate_latest

_LAT = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
_ITL = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28)


@dataclass(slots=True)
class Series:
    """The labelled children of one (tenant, adapter, version), resolved once and cached."""

    latency: Any
    queue: Any
    ttft: Any
    itl: Any
    prompt_tokens: Any
    completion_tokens: Any


class GatewayMetrics:
    def __init__(
        self,
        registry: CollectorRegistry | None = None,
        *,
        tenant_labels: bool = True,
        snapshot_age: Callable[[], float] | None = None,
    ) -> None:
        self.registry = registry or CollectorRegistry(auto_describe=True)
        self.tenant_labels = tenant_labels
        r = self.registry
        lbl = ["tenant", "adapter", "version"]
        self.requests = Counter(
            "loraplane_gateway_requests", "Completion requests answered, by status code.",
            [*lbl, "endpoint", "code"], registry=r,
        )  # fmt: skip
        self.errors = Counter(
            "loraplane_gateway_errors", "Error answers, by error code.", [*lbl, "error"], registry=r
        )
        self.latency = Histogram(
            "loraplane_gateway_request_seconds", "Whole request latency.", lbl, buckets=_LAT, registry=r
        )
        self.ttft = Histogram(
            "loraplane_gateway_ttft_seconds", "Time to first token (first streamed byte).", lbl,
            buckets=_LAT, registry=r,
        )  # fmt: skip
        self.itl = Histogram(
            "loraplane_gateway_inter_token_seconds", "Mean inter-token latency of a stream.", lbl,
            buckets=_ITL, registry=r,
        )  # fmt: skip
        self.tokens = Counter(
            "loraplane_gateway_tokens",
            "Tokens served (from the replica's usage).",
            [*lbl, "kind"],
            registry=r,
        )
        self.queue = Histogram(
            "loraplane_gateway_queue_seconds", "Time waiting for placement / load before forwarding.", lbl,
            buckets=_LAT, registry=r,
        )  # fmt: skip
        self.cold_wait = Histogram(
            "loraplane_gateway_cold_load_wait_seconds", "Wait of requests that waited for an adapter load.",
            ["adapter", "version"], buckets=_LAT, registry=r,
        )  # fmt: skip
        self.ratelimited = Counter(
            "loraplane_gateway_ratelimit_rejections", "Requests refused by a rate limit, by limit kind.",
            ["tenant", "limit", "scope"], registry=r,
        )  # fmt: skip
        self.limiter_errors = Counter(
            "loraplane_gateway_ratelimit_store_errors", "Rate-limit store failures, by on_error mode.",
            ["mode"], registry=r,
        )  # fmt: skip
        if snapshot_age is not None:
            self.snapshot_age = Gauge(
                "loraplane_snapshot_age_seconds",
                "Seconds since this gateway's routing table last matched the registry (a load, an applied "
                "change or a revision check); grows while PostgreSQL is unreachable.",
                registry=r,
            )
            self.snapshot_age.set_function(snapshot_age)

        self._series: dict[tuple[str, str, str], Series] = {}
        self._counts: dict[tuple[str, str, str, str, int, str], tuple[Any, Any]] = {}

    def series(self, tenant: str, adapter: str, version: str) -> Series:
        key = (tenant, adapter, version)
        s = self._series.get(key)
        if s is None:
            s = Series(
                self.latency.labels(*key),
                self.queue.labels(*key),
                self.ttft.labels(*key),
                self.itl.labels(*key),
                self.tokens.labels(*key, "prompt"),
                self.tokens.labels(*key, "completion"),
            )
            self._series[key] = s
        return s

    def count(self, tenant: str, adapter: str, version: str, endpoint: str, status: int, error: str) -> None:
        """One answer: requests{code} (+ errors{error})."""
        key = (tenant, adapter, version, endpoint, status, error)
        c = self._counts.get(key)
        if c is None:
            req = self.requests.labels(tenant, adapter, version, endpoint, str(status))
            err = self.errors.labels(tenant, adapter, version, error) if error else None
            c = self._counts[key] = (req, err)
        c[0].inc()
        if c[1] is not None:
            c[1].inc()

    def tenant(self, tenant_id: str) -> str:
        return tenant_id if self.tenant_labels else ""

    def render(self) -> bytes:
        own = generate_latest(self.registry)
        if self.registry is REGISTRY:
            return own
        return own + generate_latest(REGISTRY)
