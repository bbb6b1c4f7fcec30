"""Prometheus metrics of canary analysis (``loraplane_canary_*``, SPEC §16), in the process that
holds the analyser lease (the default registry: the gateway's ``/metrics`` shows them)."""

from __future__ import annotations

import contextlib

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge

_default: CanaryMetrics | None = None


class CanaryMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        r = registry
        self.leader = Gauge(
            "loraplane_canary_analyser_leader", "1 while this process holds the canary analyser lease.",
            registry=r,
        )  # fmt: skip
        self.requests = Gauge(
            "loraplane_canary_requests", "Answers counted in the current analysis window, per arm.",
            ["adapter", "version", "arm"], registry=r,
        )  # fmt: skip
        self.error_rate = Gauge(
            "loraplane_canary_error_rate", "Error rate in the current analysis window, per arm.",
            ["adapter", "version", "arm"], registry=r,
        )  # fmt: skip
        self.p_value = Gauge(
            "loraplane_canary_p_value", "p-value of the latest look, per test (error_rate, ttft).",
            ["adapter", "version", "test"], registry=r,
        )  # fmt: skip
        self.looks = Counter(
            "loraplane_canary_looks", "Looks (tests run on a window's evidence), by result.",
            ["adapter", "result"], registry=r,
        )  # fmt: skip
        self.aborts = Counter(
            "loraplane_canary_aborts", "Canaries aborted by the analyser.", ["adapter", "version"], registry=r
        )
        self.promotions = Counter(
            "loraplane_canary_promotions",
            "Canaries auto-promoted (kind=promoted) or submitted for approval (kind=requested).",
            ["adapter", "version", "kind"], registry=r,
        )  # fmt: skip

    def forget(self, adapter: str, version: str) -> None:
        """Drop the gauges of a canary that is no longer watched."""
        for g, extra in ((self.requests, ("canary", "active")), (self.error_rate, ("canary", "active")),
                         (self.p_value, ("error_rate", "ttft"))):  # fmt: skip
            for e in extra:
                with contextlib.suppress(KeyError):
                    g.remove(adapter, version, e)


def default_metrics() -> CanaryMetrics:
    """The process-wide metrics in the default registry (created once)."""
    global _default
    if _default is None:
        _default = CanaryMetrics(REGISTRY)
    return _default
