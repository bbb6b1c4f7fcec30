"""Prometheus metrics of the router (one set per CollectorRegistry; default: the global one)."""

from __future__ import annotations

import threading

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram

_LOAD_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)


class RouterMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.loads = Counter(
            "loraplane_adapter_loads",
            "Adapter loads made by the router, by result (ok, not_found, rejected, timeout, "
            "replica_down, hash_mismatch, staging_failed, other).",
            ["replica", "adapter", "version", "result"],
            registry=registry,
        )
        self.load_seconds = Histogram(
            "loraplane_adapter_load_seconds",
            "Duration of adapter loads (staging + verification + engine load).",
            ["adapter", "version"],
            buckets=_LOAD_BUCKETS,
            registry=registry,
        )
        self.unloads = Counter(
            "loraplane_adapter_unloads",
            "Adapter unloads made by the router, by reason (evict, disabled, retired, gone).",
            ["replica", "adapter", "version", "reason"],
            registry=registry,
        )
        self.cold_wait = Histogram(
            "loraplane_cold_start_wait_seconds",
            "Time requests waited for an adapter load before being forwarded.",
            ["adapter", "version"],
            buckets=_LOAD_BUCKETS,
            registry=registry,
        )
        self.placement = Counter(
            "loraplane_placement",
            "Placement outcomes: hit (resident), load (first copy), replicate (another copy), evict.",
            ["outcome"],
            registry=registry,
        )
        self.replicas_healthy = Gauge(
            "loraplane_replicas_healthy", "Healthy replicas per pool.", ["pool"], registry=registry
        )
        self.fallbacks = Counter(
            "loraplane_fallbacks",
            "Requests answered by an adapter's on_load_failure policy (SPEC §15), by the version that "
            "could not be served and the kind of fallback (previous_version, base_model).",
            ["adapter", "version", "kind"],
            registry=registry,
        )
        self.wrong_adapter = Counter(
            "loraplane_wrong_adapter_answers",
            "Replica answers that came from another model than the one asked for.",
            ["replica"],
            registry=registry,
        )


_lock = threading.Lock()
_by_registry: dict[int, RouterMetrics] = {}


def router_metrics(registry: CollectorRegistry | None = None) -> RouterMetrics:
    """The metrics bound to ``registry`` (created once per registry, so several routers may share)."""
    reg = registry if registry is not None else REGISTRY
    with _lock:
        m = _by_registry.get(id(reg))
        if m is None:
            m = RouterMetrics(reg)
            _by_registry[id(reg)] = m
        return m
