"""Prometheus metrics of the router (one set per CollectorRegistry; default: the global one).

The families labelled by adapter version or replica are kept bounded by the gateway's sweep
(``gateway.metrics_sweep``): ``take_touched()`` tells which versions' label sets moved since the
last sweep (read from the children's values, so recording costs nothing extra),
``drop_versions()`` and ``drop_replicas()`` remove label sets (``remove(*labels)``; the next
``labels()`` call re-creates one from zero).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from collections.abc import Set as AbstractSet
from typing import Any, cast

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.metrics import MetricWrapperBase

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
            "could not be served, the kind of fallback (previous_version, base_model) and the version "
            "that answered instead (`base` for the base model).",
            ["adapter", "version", "kind", "served_version"],
            registry=registry,
        )
        self.wrong_adapter = Counter(
            "loraplane_wrong_adapter_answers",
            "Replica answers that came from another model than the one asked for.",
            ["replica"],
            registry=registry,
        )
        self.tiers = Counter(
            "loraplane_adapter_tier",
            "Requests placed, by where their adapter came from on the chosen replica (estimated): gpu "
            "(in a GPU slot), cpu (copied from the engine's host cache), disk (re-read by the engine), "
            "load (loaded by the router).",
            ["pool", "tier"],
            registry=registry,
        )
        self.desired_replicas = Gauge(
            "loraplane_pool_desired_replicas",
            "Replicas the placement plan wants in each pool (forecast demand, adapter slots, queueing): "
            "the autoscaling signal. Every gateway exports the cluster's value: aggregate with max.",
            ["pool"],
            registry=registry,
        )
        self.demand = Gauge(
            "loraplane_adapter_demand_rps",
            "Forecast request rate of each planned adapter version, cluster-wide (aggregate with max).",
            ["adapter", "version"],
            registry=registry,
        )
        self.planned = Gauge(
            "loraplane_adapter_planned_replicas",
            "Replicas the placement plan gives each adapter version (aggregate with max).",
            ["adapter", "version"],
            registry=registry,
        )
        self.plan_actions = Counter(
            "loraplane_plan_actions",
            "Actions of the placement plan executed by this process (load: ahead of demand; "
            "skipped: refused by the cluster, e.g. no room).",
            ["action"],
            registry=registry,
        )
        # (family, index of its `adapter` label (`version` follows it), index of its `replica` label)
        self._retained: tuple[tuple[MetricWrapperBase, int | None, int | None], ...] = (
            (self.loads, 1, 0),
            (self.load_seconds, 0, None),
            (self.unloads, 1, 0),
            (self.cold_wait, 0, None),
            (self.fallbacks, 0, None),
            (self.wrong_adapter, None, 0),
            (self.demand, 0, None),
            (self.planned, 0, None),
        )
        # per retained family: label values → its last reading (``take_touched``)
        self._readings: list[dict[tuple[str, ...], float]] = [{} for _ in self._retained]

    def take_touched(self) -> tuple[set[tuple[str, str]], set[tuple[str, str]]]:
        """(every (adapter, version) with label sets here, those whose label sets moved since the
        last call: a new one, or a value that changed)."""
        present: set[tuple[str, str]] = set()
        touched: set[tuple[str, str]] = set()
        for i, (family, a, _r) in enumerate(self._retained):
            if a is None:
                continue
            before = self._readings[i]
            after: dict[tuple[str, ...], float] = {}
            read = _histogram_reading if isinstance(family, Histogram) else _counter_reading
            for labels, child in _children(family):
                v = (labels[a], labels[a + 1])
                present.add(v)
                now = after[labels] = read(child)
                if before.get(labels) != now:
                    touched.add(v)
            self._readings[i] = after
        return present, touched

    def drop_versions(self, versions: AbstractSet[tuple[str, str]]) -> int:
        """Remove the label sets of ``versions`` (every replica, result, reason, kind)."""
        return self._drop(lambda a, r, labels: a is not None and (labels[a], labels[a + 1]) in versions)

    def drop_replicas(self, keep: AbstractSet[str]) -> int:
        """Remove the label sets of replicas not in ``keep`` (they left the pool)."""
        return self._drop(lambda a, r, labels: r is not None and labels[r] not in keep)

    def _drop(self, doomed: Callable[[int | None, int | None, tuple[str, ...]], bool]) -> int:
        n = 0
        for i, (family, a, r) in enumerate(self._retained):
            for labels, _child in _children(family):
                if doomed(a, r, labels):
                    family.remove(*labels)
                    self._readings[i].pop(labels, None)
                    n += 1
        return n


def _children(family: MetricWrapperBase) -> list[tuple[tuple[str, ...], Any]]:
    """The labelled children of ``family`` (label values → child), copied under its lock.
    prometheus_client keeps them in ``_metrics`` (keyed by tuples of str) and has no public
    accessor but ``collect()``, which would build every sample (15 per histogram child) each sweep."""
    with family._lock:
        return list(cast("dict[tuple[str, ...], Any]", family._metrics).items())


# A number that grows with every event of a child: a counter's value; for a histogram its sum plus
# its first bucket's count (an observation of 0 lands there and leaves the sum as it was).
def _counter_reading(child: Any) -> float:
    return float(child._value.get())


def _histogram_reading(child: Any) -> float:
    return float(child._sum.get() + child._buckets[0].get())


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
