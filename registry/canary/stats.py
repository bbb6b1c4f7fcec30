"""One-sided tests of canary analysis (SPEC §16), in pure Python (``math.erfc``): no scipy.

- Error rates: a two-proportion z-test of H0 ``p_canary - p_active <= margin`` against
  H1 ``p_canary - p_active > margin``, on Agresti–Caffo adjusted proportions (one success and one
  failure added to each arm). Unlike the plain Wald test it behaves with zero errors in an arm
  (no zero variance) and holds its size at the sample sizes a canary sees; with ``margin = 0`` it
  answers like Fisher's exact test to within the normal approximation once each arm has a few
  hundred answers.
- TTFT: the Mann-Whitney U test (canary stochastically larger), on the bucketed sketch: buckets
  are tie groups, so U takes the mid-rank of each tie and the variance its tie correction
  (normal approximation with continuity correction). Exact for the bucketed values; the bucketing
  (5 %) only merges answers closer than that, which makes the test slightly conservative.
"""

from __future__ import annotations

import math
from collections.abc import Mapping


def normal_sf(z: float) -> float:
    """P(Z > z) for a standard normal Z."""
    return 0.5 * math.erfc(z / math.sqrt(2.0))


def error_rate_p_value(
    n_canary: int, err_canary: int, n_active: int, err_active: int, margin: float
) -> float:
    """One-sided p-value that the canary's error rate exceeds the active's by more than ``margin``."""
    if n_canary <= 0 or n_active <= 0:
        return 1.0
    pc = (err_canary + 1) / (n_canary + 2)
    pa = (err_active + 1) / (n_active + 2)
    se = math.sqrt(pc * (1 - pc) / (n_canary + 2) + pa * (1 - pa) / (n_active + 2))
    return normal_sf((pc - pa - margin) / se)


def mann_whitney_greater(canary: Mapping[int, int], active: Mapping[int, int]) -> float:
    """One-sided p-value that canary values are stochastically larger than active ones, from
    two histograms over the same ordered buckets (ties within a bucket)."""
    n1 = sum(c for c in canary.values() if c > 0)
    n2 = sum(c for c in active.values() if c > 0)
    if n1 == 0 or n2 == 0:
        return 1.0
    n = n1 + n2
    u = 0.0
    below = 0  # active values in lower buckets
    tie_term = 0.0
    for b in sorted(set(canary) | set(active)):
        c1 = max(canary.get(b, 0), 0)
        c2 = max(active.get(b, 0), 0)
        u += c1 * (below + 0.5 * c2)
        below += c2
        t = c1 + c2
        tie_term += t**3 - t
    mean = n1 * n2 / 2.0
    var = n1 * n2 / 12.0 * ((n + 1) - tie_term / (n * (n - 1))) if n > 1 else 0.0
    if var <= 0:
        return 1.0
    return normal_sf((u - mean - 0.5) / math.sqrt(var))
