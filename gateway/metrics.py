"""Prometheus metrics of the gateway, per tenant, adapter and version (SPEC §9).

``GatewayMetrics(registry=None)`` uses its own ``CollectorRegistry`` (several apps in one test
process must not collide); ``/metrics`` renders it together with the default registry (where
the router records loads, placements and replica health). ``snapshot_age`` (the routing table's
``age_s``) becomes ``loraplane_snapshot_age_seconds``, read at scrape time.

Label sets are bounded per adapter version (``gateway.metrics_sweep``): every labelled child of
the request families is created through ``series()`` / ``count()`` and cached there, each cache
entry with a ``used`` flag the hot path sets (one attribute store); ``take_touched()`` reads and
clears the flags, ``drop_versions()`` removes a version's label sets from the families and the
caches (a later request re-creates them, starting from zero).
"""

from __future__ import annotations

from collections.abc import Callable
from collections.abc import Set as AbstractSet
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
    used: bool = True  # set on every use, cleared by each sweep (``take_touched``)


@dataclass(slots=True)
class _Count:
    """The requests child (and errors child, or None) of one answer kind, cached."""

    req: Any
    err: Any
    used: bool = True


Version = tuple[str, str]  # (adapter id, version); ("", "") for the bare base model / no model


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
            "loraplane_gateway_requests",
            "Completion requests answered, by status code; `version` is the version asked for, "
            "`served_version` the one that answered (another one, or `base`, after a load-failure "
            "fallback; empty when nothing answered).",
            [*lbl, "served_version", "endpoint", "code"], registry=r,
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
        self._counts: dict[tuple[str, str, str, str, str, int, str], _Count] = {}

    def series(self, tenant: str, adapter: str, version: str) -> Series:
        key = (tenant, adapter, version)
        s = self._series.get(key)
        if s is not None:
            s.used = True
        else:
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

    def count(
        self, tenant: str, adapter: str, version: str, endpoint: str, status: int, error: str,
        served: str | None = None,
    ) -> None:  # fmt: skip
        """One answer: requests{served_version, code} (+ errors{error}); ``served`` is the version
        that answered (default: ``version``; "" when nothing did)."""
        if served is None:
            served = version
        key = (tenant, adapter, version, served, endpoint, status, error)
        c = self._counts.get(key)
        if c is not None:
            c.used = True
        else:
            req = self.requests.labels(tenant, adapter, version, served, endpoint, str(status))
            err = self.errors.labels(tenant, adapter, version, error) if error else None
            c = self._counts[key] = _Count(req, err)
        c.req.inc()
        if c.err is not None:
            c.err.inc()

    # ------------------------------------------------------------------ retention (not per request)

    def take_touched(self) -> tuple[set[Version], set[Version]]:
        """(every version with label sets here, those used since the last call); clears the flags."""
        present: set[Version] = set()
        touched: set[Version] = set()
        for entries in (self._counts, self._series):
            for key, entry in entries.items():
                v = (key[1], key[2])
                present.add(v)
                if entry.used:
                    entry.used = False
                    touched.add(v)
        return present, touched

    def drop_versions(self, versions: AbstractSet[Version]) -> int:
        """Remove every label set of ``versions`` (all tenants, endpoints, codes) from the families
        and the caches. Returns how many cache entries went."""
        if not versions:
            return 0
        gone = 0
        for ck in [k for k in self._counts if (k[1], k[2]) in versions]:
            c = self._counts.pop(ck)
            tenant, adapter, version, served, endpoint, status, error = ck
            self.requests.remove(tenant, adapter, version, served, endpoint, str(status))
            if c.err is not None:
                self.errors.remove(tenant, adapter, version, error)
            gone += 1
        for sk in [k for k in self._series if (k[1], k[2]) in versions]:
            del self._series[sk]
            for family in (self.latency, self.queue, self.ttft, self.itl):
                family.remove(*sk)
            self.tokens.remove(*sk, "prompt")
            self.tokens.remove(*sk, "completion")
            gone += 1
        for adapter, version in versions:
            self.cold_wait.remove(adapter, version)  # created by the API per wait, not cached
        return gone

    def tenant(self, tenant_id: str) -> str:
        return tenant_id if self.tenant_labels else ""

    def render(self) -> bytes:
        own = generate_latest(self.registry)
        if self.registry is REGISTRY:
            return own
        return own + generate_latest(REGISTRY)
