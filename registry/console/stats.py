"""Turn a traffic window into the traffic page's rows: totals, quantiles and chart series.

Pure functions of a :class:`~registry.console.traffic.TrafficWindow`, so they are tested without
a gateway. Only the rows on the page get chart series, downsampled to at most ``CHART_POINTS``
points, so the page costs the same with ten series or a thousand.
"""

from __future__ import annotations

from dataclasses import dataclass

from registry.console.traffic import Key, TrafficWindow, quantile

CHART_POINTS = 60


@dataclass(frozen=True, slots=True)
class TrafficRow:
    adapter: str
    version: str
    requests: int
    errors: int  # error answers other than rate-limit refusals
    rate_limited: int  # 429 rate_limit_exceeded
    latency_p50: float | None  # whole answers (non-streamed traffic's only latency)
    latency_p99: float | None
    ttft_p50: float | None
    ttft_p99: float | None
    itl_p50: float | None
    itl_p99: float | None
    tokens_per_s: float
    loads: int
    cold_waits: int
    requests_series: list[float]  # requests per chart point
    ttft_series: list[float | None]  # median of the intervals' TTFT p50 per chart point


def _chunks(n: int, points: int) -> list[range]:
    size = max(1, -(-n // points))
    return [range(i, min(i + size, n)) for i in range(0, n, size)]


def summarize(window: TrafficWindow, *, limit: int = 50, offset: int = 0) -> tuple[list[TrafficRow], int]:
    """Rows ``offset … offset+limit`` of the series seen in the window, busiest first, and how
    many there are in all."""
    ordered = sorted(window.totals.items(), key=lambda kv: (-kv[1].requests, kv[0]))
    span = window.seconds or 1.0
    chunks = _chunks(len(window.intervals), CHART_POINTS)
    rows = []
    for key, t in ordered[offset : offset + limit]:
        reqs, ttft = _series(window, key, chunks)
        rows.append(
            TrafficRow(
                adapter=key[0],
                version=key[1],
                requests=round(t.requests),
                errors=round(t.errors),
                rate_limited=round(t.rate_limited),
                latency_p50=quantile(0.5, t.latency),
                latency_p99=quantile(0.99, t.latency),
                ttft_p50=quantile(0.5, t.ttft),
                ttft_p99=quantile(0.99, t.ttft),
                itl_p50=quantile(0.5, t.itl),
                itl_p99=quantile(0.99, t.itl),
                tokens_per_s=t.tokens / span,
                loads=round(t.loads),
                cold_waits=round(t.cold_waits),
                requests_series=reqs,
                ttft_series=ttft,
            )
        )
    return rows, len(ordered)


def _series(window: TrafficWindow, key: Key, chunks: list[range]) -> tuple[list[float], list[float | None]]:
    """Requests summed, and the median of the intervals' TTFT medians, per chart point."""
    points = [window.intervals[i].series.get(key) for i in range(len(window.intervals))]
    reqs: list[float] = []
    ttft: list[float | None] = []
    for c in chunks:
        got = [p for i in c if (p := points[i]) is not None]
        reqs.append(sum(p[0] for p in got))
        vals = sorted(v for _, v in got if v is not None)
        ttft.append(vals[len(vals) // 2] if vals else None)
    return reqs, ttft


def sparkline(values: list[float] | list[float | None], *, width: int = 160, height: int = 28) -> str:
    """SVG ``polyline`` points for ``values`` (None drawn as 0), scaled to the box."""
    if not values:
        return ""
    vals = [v if v is not None else 0.0 for v in values]
    top = max(vals) or 1.0
    step = width / max(len(vals) - 1, 1)
    return " ".join(f"{i * step:.1f},{height - 1 - (v / top) * (height - 2):.1f}" for i, v in enumerate(vals))
