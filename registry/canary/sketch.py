"""TTFT sketch: a log-bucketed histogram (5 % wide buckets from 0.1 ms), mergeable by adding
counts, so every gateway can add its answers to one shared hash and the analyser can subtract a
baseline. Quantiles are read to within one bucket (5 %); ranks for the Mann-Whitney test treat a
bucket as a tie group (see :mod:`registry.canary.stats`)."""

from __future__ import annotations

import math
from collections.abc import Mapping

_FLOOR_S = 1e-4
_GROWTH = 1.05
_LOG_GROWTH = math.log(_GROWTH)
MAX_BUCKET = 400  # 0.1 ms × 1.05^400 ≈ 3e4 s: everything longer lands here


def bucket_of(seconds: float) -> int:
    """The bucket of a duration: 0 for ≤ 0.1 ms, then one bucket per 5 %."""
    if not seconds > _FLOOR_S:  # also NaN
        return 0
    return min(MAX_BUCKET, math.ceil(math.log(seconds / _FLOOR_S) / _LOG_GROWTH))


def upper_edge(bucket: int) -> float:
    """The longest duration of ``bucket`` (seconds)."""
    return _FLOOR_S * _GROWTH**bucket


def quantile(hist: Mapping[int, int], q: float) -> float | None:
    """The ``q`` quantile (upper bucket edge, so never an underestimate); None when empty."""
    total = sum(c for c in hist.values() if c > 0)
    if total == 0:
        return None
    need = q * total
    seen = 0
    for b in sorted(hist):
        c = hist[b]
        if c <= 0:
            continue
        seen += c
        if seen >= need:
            return upper_edge(b)
    return upper_edge(max(hist))
