"""Traffic for the console's traffic page: per (adapter, version) counters over the last hour.

``TrafficSource`` is the seam: ``points()`` returns the retained samples, oldest first. A sample
holds cumulative counters per (adapter, version) at one instant; the page derives each
interval's requests, errors, TTFT/ITL quantiles, tokens/s, loads and cold-start waits from the
difference of consecutive samples, so a gateway restart (counters going back to zero) only
costs one interval.

- ``RingTraffic`` is the embedded default (``loraplane up``): a bounded ring (``capacity``
  samples, default 360 = one hour at 10 s) filled by a daemon thread that reads Prometheus
  ``CollectorRegistry`` objects of the same process (the gateway's own registry and the global
  one, where the router counts loads). No Prometheus server is needed.
- ``NoTraffic`` is used when the admin API runs without a gateway in its process; the page
  says so instead of drawing empty charts.

Metric names read (the gateway's and router's public ``/metrics`` names):
``loraplane_gateway_requests_total``, ``loraplane_gateway_errors_total``,
``loraplane_gateway_ttft_seconds_bucket``, ``loraplane_gateway_inter_token_seconds_bucket``,
``loraplane_gateway_tokens_total{kind="completion"}``, ``loraplane_adapter_loads_total``,
``loraplane_cold_start_wait_seconds_count``.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Protocol

from prometheus_client import CollectorRegistry

Key = tuple[str, str]  # (adapter, version)


@dataclass(slots=True)
class Counters:
    """Cumulative counters of one (adapter, version) at one instant."""

    requests: float = 0.0
    errors: float = 0.0
    tokens: float = 0.0
    loads: float = 0.0
    cold_waits: float = 0.0
    ttft: dict[float, float] = field(default_factory=dict)  # cumulative bucket counts by upper bound
    itl: dict[float, float] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Sample:
    ts: float  # unix seconds
    series: dict[Key, Counters]


class TrafficSource(Protocol):
    """What the traffic page reads. ``description`` says where the numbers come from."""

    description: str

    def points(self) -> list[Sample]:
        """Retained samples, oldest first (at most an hour's worth)."""
        ...


class NoTraffic:
    description = (
        "no gateway runs in this process: the traffic page is fed by the gateway embedded by "
        "`loraplane up` (use Prometheus/Grafana for separate gateways)"
    )

    def points(self) -> list[Sample]:
        return []


_BUCKET_FAMILIES = {
    "loraplane_gateway_ttft_seconds_bucket": "ttft",
    "loraplane_gateway_inter_token_seconds_bucket": "itl",
}


def read_registries(registries: Iterable[CollectorRegistry]) -> dict[Key, Counters]:
    """Sum the gateway's and router's series per (adapter, version) across tenants/replicas."""
    out: dict[Key, Counters] = {}

    def at(labels: dict[str, str]) -> Counters | None:
        adapter, version = labels.get("adapter", ""), labels.get("version", "")
        if not adapter:
            return None  # bare base-model traffic has no adapter: not an adapter's row
        c = out.get((adapter, version))
        if c is None:
            c = out[(adapter, version)] = Counters()
        return c

    for reg in registries:
        for family in reg.collect():
            if not family.name.startswith("loraplane_"):
                continue
            for s in family.samples:
                name = s.name
                if name == "loraplane_gateway_requests_total":
                    if (c := at(s.labels)) is not None:
                        c.requests += s.value
                elif name == "loraplane_gateway_errors_total":
                    if (c := at(s.labels)) is not None:
                        c.errors += s.value
                elif name == "loraplane_gateway_tokens_total":
                    if s.labels.get("kind") == "completion" and (c := at(s.labels)) is not None:
                        c.tokens += s.value
                elif name == "loraplane_adapter_loads_total":
                    if s.labels.get("result") == "ok" and (c := at(s.labels)) is not None:
                        c.loads += s.value
                elif name == "loraplane_cold_start_wait_seconds_count":
                    if (c := at(s.labels)) is not None:
                        c.cold_waits += s.value
                elif name in _BUCKET_FAMILIES and (c := at(s.labels)) is not None:
                    buckets = c.ttft if _BUCKET_FAMILIES[name] == "ttft" else c.itl
                    le = float(s.labels["le"])
                    buckets[le] = buckets.get(le, 0.0) + s.value
    return out


class RingTraffic:
    """Bounded in-process ring of samples read from Prometheus registries of this process."""

    description = "sampled in this process from the embedded gateway's metrics"

    def __init__(
        self,
        registries: list[CollectorRegistry],
        *,
        interval_s: float = 10.0,
        capacity: int = 360,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._registries = list(registries)
        self.interval_s = interval_s
        self._clock = clock
        self._ring: deque[Sample] = deque(maxlen=capacity)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def sample(self) -> Sample:
        """Take one sample now (the thread calls this every ``interval_s``)."""
        s = Sample(self._clock(), read_registries(self._registries))
        with self._lock:
            self._ring.append(s)
        return s

    def points(self) -> list[Sample]:
        with self._lock:
            return list(self._ring)

    def start(self) -> RingTraffic:
        if self._thread is None:
            self.sample()
            self._thread = threading.Thread(target=self._run, name="console-traffic", daemon=True)
            self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.sample()

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
