"""Turn traffic samples into the traffic page's rows: totals and per-interval series.

Pure functions of ``Sample`` lists (see :mod:`registry.console.traffic`), so they are tested
without a gateway. Quantiles are estimated from histogram bucket deltas the way Prometheus'
``histogram_quantile`` does (linear inside the bucket).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

from registry.console.traffic import Counters, Key, Sample


@dataclass(frozen=True, slots=True)
class TrafficRow:
    adapter: str
    version: str
    requests: int
    errors: int
    ttft_p50: float | None
    ttft_p99: float | None
    itl_p50: float | None
    itl_p99: float | None
    tokens_per_s: float
    loads: int
    cold_waits: int
    requests_series: list[float]  # requests per interval
    ttft_series: list[float | None]  # p50 TTFT per interval (None: no request)


def _delta(cur: float, prev: float) -> float:
    return cur - prev if cur >= prev else cur  # a restarted process starts again from 0


def _bucket_delta(cur: dict[float, float], prev: dict[float, float]) -> dict[float, float]:
    reset = any(cur.get(le, 0.0) < v for le, v in prev.items())
    if reset:
        return dict(cur)
    return {le: v - prev.get(le, 0.0) for le, v in cur.items()}


def quantile(q: float, buckets: dict[float, float]) -> float | None:
    """``q``-quantile from cumulative bucket counts keyed by upper bound (``inf`` included)."""
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


def _add(into: dict[float, float], more: dict[float, float]) -> None:
    for le, v in more.items():
        into[le] = into.get(le, 0.0) + v


def summarize(points: list[Sample]) -> list[TrafficRow]:
    """One row per (adapter, version) seen in the window, busiest first."""
    if len(points) < 2:
        return []
    keys: set[Key] = set()
    for p in points:
        keys.update(p.series)
    empty = Counters()
    rows = []
    span = max(points[-1].ts - points[0].ts, 1e-9)
    for key in keys:
        req_series: list[float] = []
        ttft_series: list[float | None] = []
        totals = Counters()
        for prev, cur in itertools.pairwise(points):
            a, b = prev.series.get(key, empty), cur.series.get(key, empty)
            n = _delta(b.requests, a.requests)
            req_series.append(n)
            totals.requests += n
            totals.errors += _delta(b.errors, a.errors)
            totals.tokens += _delta(b.tokens, a.tokens)
            totals.loads += _delta(b.loads, a.loads)
            totals.cold_waits += _delta(b.cold_waits, a.cold_waits)
            ttft = _bucket_delta(b.ttft, a.ttft)
            itl = _bucket_delta(b.itl, a.itl)
            _add(totals.ttft, ttft)
            _add(totals.itl, itl)
            ttft_series.append(quantile(0.5, ttft))
        if totals.requests == 0 and totals.loads == 0 and totals.cold_waits == 0:
            continue
        rows.append(
            TrafficRow(
                adapter=key[0],
                version=key[1],
                requests=round(totals.requests),
                errors=round(totals.errors),
                ttft_p50=quantile(0.5, totals.ttft),
                ttft_p99=quantile(0.99, totals.ttft),
                itl_p50=quantile(0.5, totals.itl),
                itl_p99=quantile(0.99, totals.itl),
                tokens_per_s=totals.tokens / span,
                loads=round(totals.loads),
                cold_waits=round(totals.cold_waits),
                requests_series=req_series,
                ttft_series=ttft_series,
            )
        )
    rows.sort(key=lambda r: (-r.requests, r.adapter, r.version))
    return rows


def sparkline(values: list[float | None], *, width: int = 160, height: int = 28) -> str:
    """SVG ``polyline`` points for ``values`` (None drawn as 0), scaled to the box."""
    if not values:
        return ""
    vals = [v if v is not None else 0.0 for v in values]
    top = max(vals) or 1.0
    step = width / max(len(vals) - 1, 1)
    return " ".join(f"{i * step:.1f},{height - 1 - (v / top) * (height - 2):.1f}" for i, v in enumerate(vals))
