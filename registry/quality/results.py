"""The figures of an evaluation (SPEC §16), from each arm's answers. Pure functions.

Per arm (:func:`arm_stats`):

- ``pass_rate``: share of cases whose every check passed (a case without checks passes when its
  request succeeded); ``pass_rate_by_check``: per check type, passed checks / checks of that type.
- ``format_error_rate``: among cases with a ``json_schema`` or ``regex`` check, the share where
  at least one of those failed (null when no case has one).
- ``refusal_rate``: share of answered cases whose output is a refusal (``checks.is_refusal``).
- ``mean_output_chars``: mean length of the outputs (answered cases); ``errors``: failed requests.
- ``latency_ms``: p50 / p99 of the answered requests (nearest rank).

Pairwise (:func:`pairwise`): ``exact_match_rate`` (identical outputs) and ``similarity`` (mean
``difflib.SequenceMatcher`` ratio of the first :data:`SIMILARITY_CHARS` characters) of the
candidate against another arm, over cases both answered. The stored result keeps each answer's
first :data:`STORED_OUTPUT_CHARS` characters (``output_chars``: its whole length); checks and
exact matches see whole answers.

Verdict (:func:`verdict`) from the adapter's ``quality_policy``: the candidate's pass rate is at
least ``min_pass_rate``; it is at most ``max_regression_pp`` percentage points below the current
version's (when there is a current arm); its format-error rate is at most
``max_format_error_rate`` (when it has format checks).
"""

from __future__ import annotations

import difflib
import math
from dataclasses import dataclass, field
from typing import Any

from registry.quality.cases import FORMAT_CHECKS
from registry.quality.checks import CheckResult, is_refusal

DEFAULT_POLICY: dict[str, float] = {
    "min_pass_rate": 0.9,
    "max_regression_pp": 5.0,
    "max_format_error_rate": 0.05,
}
ARMS = ("base", "current", "candidate")
STORED_OUTPUT_CHARS = 4000  # of each answer in the stored result (checks see the whole answer)
SIMILARITY_CHARS = 4000  # of each answer compared by similarity (difflib is quadratic)


@dataclass(slots=True)
class Answer:
    """One case answered (or not) by one arm."""

    output: str | None
    latency_ms: float | None
    error: str | None
    checks: list[CheckResult] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return self.output is not None and all(c.passed for c in self.checks)

    def to_json(self) -> dict[str, Any]:
        out = self.output
        return {
            "output": out if out is None or len(out) <= STORED_OUTPUT_CHARS else out[:STORED_OUTPUT_CHARS],
            "output_chars": None if out is None else len(out),
            "error": self.error,
            "latency_ms": None if self.latency_ms is None else round(self.latency_ms, 1),
            "passed": self.passed,
            "refusal": None if self.output is None else is_refusal(self.output),
            "checks": [c.to_json() for c in self.checks],
        }


def _rate(num: int, den: int) -> float | None:
    return None if den == 0 else round(num / den, 4)


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return round(ordered[rank - 1], 1)


def arm_stats(model: str, answers: list[Answer]) -> dict[str, Any]:
    answered = [a for a in answers if a.output is not None]
    by_type: dict[str, list[int]] = {}
    fmt_cases = fmt_failed = 0
    for a in answers:
        fmt = [c for c in a.checks if c.type in FORMAT_CHECKS]
        if fmt:
            fmt_cases += 1
            fmt_failed += any(not c.passed for c in fmt)
        for c in a.checks:
            tally = by_type.setdefault(c.type, [0, 0])
            tally[0] += c.passed
            tally[1] += 1
    outputs = [a.output for a in answered if a.output is not None]
    latencies = [a.latency_ms for a in answered if a.latency_ms is not None]
    return {
        "model": model,
        "cases": len(answers),
        "errors": len(answers) - len(answered),
        "pass_rate": _rate(sum(a.passed for a in answers), len(answers)),
        "pass_rate_by_check": {k: _rate(v[0], v[1]) for k, v in sorted(by_type.items())},
        "format_error_rate": _rate(fmt_failed, fmt_cases),
        "refusal_rate": _rate(sum(is_refusal(o) for o in outputs), len(outputs)),
        "mean_output_chars": round(sum(len(o) for o in outputs) / len(outputs), 1) if outputs else None,
        "latency_ms": {"p50": percentile(latencies, 50), "p99": percentile(latencies, 99)},
    }


def similarity(a: str, b: str) -> float:
    """difflib's ratio of the answers' first :data:`SIMILARITY_CHARS` characters."""
    return difflib.SequenceMatcher(None, a[:SIMILARITY_CHARS], b[:SIMILARITY_CHARS], autojunk=False).ratio()


def pairwise(candidate: list[Answer], other: list[Answer]) -> dict[str, Any]:
    pairs = [(c.output, o.output) for c, o in zip(candidate, other, strict=True)]
    both = [(c, o) for c, o in pairs if c is not None and o is not None]
    return {
        "cases": len(both),
        "exact_match_rate": _rate(sum(c == o for c, o in both), len(both)),
        "similarity": round(sum(similarity(c, o) for c, o in both) / len(both), 4) if both else None,
    }


def effective_policy(policy: dict[str, Any] | None) -> dict[str, float]:
    out = dict(DEFAULT_POLICY)
    for k, v in (policy or {}).items():
        if v is not None:
            out[k] = float(v)
    return out


def verdict(arms: dict[str, dict[str, Any] | None], policy: dict[str, Any] | None) -> dict[str, Any]:
    """``{"passed", "gate", "reasons", "policy", "regression_pp"}`` for the candidate arm."""
    p = effective_policy(policy)
    cand = arms["candidate"]
    assert cand is not None
    reasons: list[str] = []
    rate = cand["pass_rate"] or 0.0
    if rate < p["min_pass_rate"]:
        reasons.append(f"pass rate {rate:.2%} is below min_pass_rate {p['min_pass_rate']:.2%}")
    regression_pp: float | None = None
    current = arms.get("current")
    if current is not None and current["pass_rate"] is not None:
        regression_pp = round((current["pass_rate"] - rate) * 100, 2)
        if regression_pp > p["max_regression_pp"]:
            reasons.append(
                f"pass rate is {regression_pp} points below the current version's "
                f"(max_regression_pp {p['max_regression_pp']})"
            )
    fmt = cand["format_error_rate"]
    if fmt is not None and fmt > p["max_format_error_rate"]:
        reasons.append(
            f"format-error rate {fmt:.2%} is above max_format_error_rate {p['max_format_error_rate']:.2%}"
        )
    passed = not reasons
    return {
        "passed": passed,
        "gate": "passed" if passed else "failed",
        "reasons": reasons,
        "policy": p,
        "regression_pp": regression_pp,
    }
