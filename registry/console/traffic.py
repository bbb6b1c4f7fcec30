"""Traffic for the console's traffic page: per (adapter, version) counters over the last hour.

``TrafficSource`` is the seam: ``window()`` returns what happened over the retained window — the
totals per (adapter, version) and, per interval, each one's requests and median TTFT (for the
charts). A sample holds cumulative counters read from Prometheus registries; each new sample
becomes one ``Interval`` (its difference from the previous sample, so a process restart —
counters back at zero — only costs one interval), and the window's totals are kept as a running
sum (added when an interval enters the ring, subtracted when it leaves), so a page never walks
an hour of samples for every series.

- ``RingTraffic`` (:mod:`registry.console.traffic_ring`) is the embedded default
  (``loraplane up``): a bounded ring (``capacity`` intervals, default 360 = one hour at 10 s)
  filled by a daemon thread that reads the ``CollectorRegistry`` objects of the same process
  (the gateway's own registry and the global one, where the router counts loads). No
  Prometheus server is needed.
- ``RedisTraffic`` (:mod:`registry.console.traffic_redis`) is for separate processes: each
  gateway publishes its readings to Redis, the admin API's reader turns them into intervals.
- ``NoTraffic`` is used when there is neither; the page says so instead of drawing empty charts.

Metric names read (the gateway's and router's public ``/metrics`` names):
``loraplane_gateway_requests_total``, ``loraplane_gateway_errors_total`` (split: a 429
``rate_limit_exceeded`` is a designed refusal, counted apart from the errors),
``loraplane_gateway_request_seconds_bucket`` (whole answers: the latency of non-streamed traffic),
``loraplane_gateway_ttft_seconds_bucket``, ``loraplane_gateway_inter_token_seconds_bucket``,
``loraplane_gateway_tokens_total{kind="completion"}``, ``loraplane_adapter_loads_total{result="ok"}``,
``loraplane_cold_start_wait_seconds_count``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Protocol

from prometheus_client import CollectorRegistry

Key = tuple[str, str]  # (adapter, version)


@dataclass(slots=True)
class Counters:
    """Cumulative counters of one (adapter, version) at one instant."""

    requests: float = 0.0
    errors: float = 0.0  # error answers other than rate-limit refusals
    tokens: float = 0.0
    loads: float = 0.0
    cold_waits: float = 0.0
    ttft: dict[float, float] = field(default_factory=dict)  # cumulative bucket counts by upper bound
    itl: dict[float, float] = field(default_factory=dict)
    rate_limited: float = 0.0  # 429 rate_limit_exceeded answers
    latency: dict[float, float] = field(default_factory=dict)  # whole-answer latency buckets


@dataclass(frozen=True, slots=True)
class Sample:
    """Cumulative counters of every series at one instant."""

    ts: float  # unix seconds
    series: dict[Key, Counters]


@dataclass(frozen=True, slots=True)
class Interval:
    """What happened between two samples: per series, (requests, the interval's median TTFT)."""

    ts: float  # end of the interval (unix seconds)
    series: dict[Key, tuple[float, float | None]]


@dataclass(frozen=True, slots=True)
class TrafficWindow:
    start: float
    end: float
    totals: dict[Key, Counters]  # deltas summed over the window (buckets: per-bucket counts)
    intervals: list[Interval]  # oldest first

    @property
    def seconds(self) -> float:
        return max(self.end - self.start, 0.0)


class TrafficSource(Protocol):
    """What the traffic page reads. ``description`` says where the numbers come from."""

    description: str

    def window(self) -> TrafficWindow:
        """The retained window (at most an hour)."""
        ...


class NoTraffic:
    description = (
        "no gateway runs in this process: the traffic page is fed by the gateway embedded by "
        "`loraplane up` (use Prometheus/Grafana for separate gateways)"
    )

    def window(self) -> TrafficWindow:
        return TrafficWindow(0.0, 0.0, {}, [])


_BUCKET_FAMILIES = {
    "loraplane_gateway_ttft_seconds_bucket": "ttft",
    "loraplane_gateway_inter_token_seconds_bucket": "itl",
    "loraplane_gateway_request_seconds_bucket": "latency",
}
RATE_LIMITED = frozenset({"rate_limit_exceeded"})  # error codes of a designed 429


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
                        if s.labels.get("error") in RATE_LIMITED:
                            c.rate_limited += s.value
                        else:
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
                    buckets = getattr(c, _BUCKET_FAMILIES[name])
                    le = float(s.labels["le"])
                    buckets[le] = buckets.get(le, 0.0) + s.value
    return out


def quantile(q: float, buckets: dict[float, float]) -> float | None:
    """``q``-quantile from cumulative bucket counts keyed by upper bound (``inf`` included),
    linear inside the bucket as Prometheus' ``histogram_quantile``."""
    if not buckets:
        return None
    bounds = sorted(buckets)
    total = buckets[bounds[-1]]
    if total <= 0:
        return None
    rank = q * total
    lower, below = 0.0, 0.0
    for le in bounds:
        count = buckets[le]
        if count >= rank:
            if math.isinf(le):
                return lower
            inside = count - below
            return lower + (le - lower) * ((rank - below) / inside if inside > 0 else 1.0)
        lower, below = le, count
    return lower


def _delta(cur: float, prev: float) -> float:
    return cur - prev if cur >= prev else cur  # a restarted process starts again from 0


def _bucket_delta(cur: dict[float, float], prev: dict[float, float]) -> dict[float, float]:
    if any(cur.get(le, 0.0) < v for le, v in prev.items()):
        return dict(cur)
    return {le: v - prev.get(le, 0.0) for le, v in cur.items()}


def difference(cur: Counters, prev: Counters) -> Counters:
    """What happened between two cumulative readings of one series."""
    return Counters(
        requests=_delta(cur.requests, prev.requests),
        errors=_delta(cur.errors, prev.errors),
        tokens=_delta(cur.tokens, prev.tokens),
        loads=_delta(cur.loads, prev.loads),
        cold_waits=_delta(cur.cold_waits, prev.cold_waits),
        ttft=_bucket_delta(cur.ttft, prev.ttft),
        itl=_bucket_delta(cur.itl, prev.itl),
        rate_limited=_delta(cur.rate_limited, prev.rate_limited),
        latency=_bucket_delta(cur.latency, prev.latency),
    )


def deltas_between(cur: dict[Key, Counters], prev: dict[Key, Counters]) -> dict[Key, Counters]:
    """The series that changed between two readings of one process, with what changed."""
    empty = Counters()
    return {
        key: d
        for key, c in cur.items()
        if (d := difference(c, prev.get(key, empty))).requests
        or d.loads
        or d.cold_waits
        or d.errors
        or d.rate_limited
    }


def merge(into: dict[Key, Counters], more: dict[Key, Counters]) -> None:
    """Add ``more``'s deltas into ``into`` (several gateways' intervals into one)."""
    for key, d in more.items():
        add_counters(into.setdefault(key, Counters()), d, 1.0)


def add_counters(into: Counters, d: Counters, sign: float) -> None:
    into.requests += sign * d.requests
    into.errors += sign * d.errors
    into.tokens += sign * d.tokens
    into.loads += sign * d.loads
    into.cold_waits += sign * d.cold_waits
    into.rate_limited += sign * d.rate_limited
    for mine, theirs in ((into.ttft, d.ttft), (into.itl, d.itl), (into.latency, d.latency)):
        for le, v in theirs.items():
            mine[le] = mine.get(le, 0.0) + sign * v


def copy_counters(c: Counters) -> Counters:
    return Counters(
        c.requests, c.errors, c.tokens, c.loads, c.cold_waits, dict(c.ttft), dict(c.itl),
        c.rate_limited, dict(c.latency),
    )  # fmt: skip
