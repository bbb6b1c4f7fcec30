"""The decision of one look: does the canary breach its policy? A pure function of the two arms'
counts in the current window, so it is tested fast and in-process (SPEC §16).

Repeated looks. The analyser looks at a window's evidence when the smaller arm reaches
``min_requests × 2^j`` answers (look ``j = 0, 1, 2, …``) and spends ``α / 2^(j+1)`` on look
``j``, shared equally (Bonferroni) by the tests it runs. The looks of one window therefore spend
at most α = 0.01 in all: a healthy canary is aborted by mistake in at most 1 % of windows, however
long the window and however much traffic it sees (α-spending; testing every tick at 0.01 would
alarm on most healthy canaries of a long run). A fresh window starts a fresh budget.

Tests (``registry.canary.stats``): error rate (breach when significantly above the active's plus
``max_error_rate_delta``), TTFT (breach when the canary is significantly slower by Mann-Whitney
*and* its p99 exceeds ``max_ttft_p99_ratio`` × the active's p99), and — for adapters whose
regression set has format checks, once each arm has :data:`MIN_CHECKED` sampled answers checked —
the format-check failure rate (same test as errors, margin ``max_check_failure_rate_delta``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from registry.canary.counters import ArmCounts
from registry.canary.policy import ALPHA, CanaryPolicy
from registry.canary.sketch import quantile
from registry.canary.stats import error_rate_p_value, mann_whitney_greater

MIN_CHECKED = 30  # sampled answers each arm needs before the format-check test runs


@dataclass(slots=True)
class CheckCounts:
    """Sampled answers checked against the regression set's format checks, per arm."""

    canary_checked: int = 0
    canary_failed: int = 0
    active_checked: int = 0
    active_failed: int = 0


def due_look(smaller_arm: int, min_requests: int, next_look: int) -> int | None:
    """The highest look index reached by ``smaller_arm`` answers, if it is ≥ ``next_look``."""
    if smaller_arm < min_requests:
        return None
    j = 0
    while smaller_arm >= min_requests * 2 ** (j + 1):
        j += 1
    return j if j >= next_look else None


def alpha_of_look(look: int) -> float:
    return ALPHA / 2 ** (look + 1)


@dataclass(frozen=True, slots=True)
class Judgement:
    breach: bool
    reasons: list[str] = field(default_factory=list)  # "error_rate", "ttft"
    evidence: dict[str, Any] = field(default_factory=dict)


def _p(value: float) -> float:
    return float(f"{value:.6g}")


def arm_summary(arm: ArmCounts) -> dict[str, Any]:
    p99 = quantile(arm.ttft, 0.99)
    p50 = quantile(arm.ttft, 0.5)
    rate = arm.error_rate
    return {
        "requests": arm.requests,
        "errors": arm.errors,
        "error_rate": round(rate, 6) if rate is not None else None,
        "ttft_p50_s": round(p50, 6) if p50 is not None else None,
        "ttft_p99_s": round(p99, 6) if p99 is not None else None,
    }


def judge(
    policy: CanaryPolicy,
    canary: ArmCounts,
    active: ArmCounts,
    *,
    look: int,
    checks: CheckCounts | None = None,
) -> Judgement:
    """One look's tests at ``alpha_of_look(look)`` (split between the tests run)."""
    tests: dict[str, dict[str, Any]] = {}
    timed = bool(canary.ttft) and bool(active.ttft)
    checked = (
        checks is not None and checks.canary_checked >= MIN_CHECKED and checks.active_checked >= MIN_CHECKED
    )
    alpha = alpha_of_look(look) / (1 + int(timed) + int(checked))
    reasons: list[str] = []

    p_err = error_rate_p_value(
        canary.requests, canary.errors, active.requests, active.errors, policy.max_error_rate_delta
    )
    rc, ra = canary.error_rate or 0.0, active.error_rate or 0.0
    err_breach = p_err < alpha
    tests["error_rate"] = {
        "p_value": _p(p_err),
        "delta": round(rc - ra, 6),
        "max_delta": policy.max_error_rate_delta,
        "breach": err_breach,
    }
    if err_breach:
        reasons.append("error_rate")

    if timed:
        p_ttft = mann_whitney_greater(canary.ttft, active.ttft)
        c99, a99 = quantile(canary.ttft, 0.99), quantile(active.ttft, 0.99)
        ratio = (c99 / a99) if c99 is not None and a99 else None
        ttft_breach = p_ttft < alpha and ratio is not None and ratio > policy.max_ttft_p99_ratio
        tests["ttft"] = {
            "p_value": _p(p_ttft),
            "p99_ratio": round(ratio, 4) if ratio is not None else None,
            "max_ratio": policy.max_ttft_p99_ratio,
            "breach": ttft_breach,
        }
        if ttft_breach:
            reasons.append("ttft")

    if checks is not None and checked:
        p_chk = error_rate_p_value(
            checks.canary_checked, checks.canary_failed, checks.active_checked, checks.active_failed,
            policy.max_check_failure_rate_delta,
        )  # fmt: skip
        fc = checks.canary_failed / checks.canary_checked
        fa = checks.active_failed / checks.active_checked
        chk_breach = p_chk < alpha
        tests["format_checks"] = {
            "p_value": _p(p_chk),
            "canary": {
                "checked": checks.canary_checked,
                "failed": checks.canary_failed,
                "failure_rate": round(fc, 6),
            },
            "active": {
                "checked": checks.active_checked,
                "failed": checks.active_failed,
                "failure_rate": round(fa, 6),
            },
            "delta": round(fc - fa, 6),
            "max_delta": policy.max_check_failure_rate_delta,
            "breach": chk_breach,
        }
        if chk_breach:
            reasons.append("format_checks")

    evidence = {
        "look": look,
        "alpha": _p(alpha),
        "canary": arm_summary(canary),
        "active": arm_summary(active),
        "tests": tests,
    }
    return Judgement(breach=bool(reasons), reasons=reasons, evidence=evidence)
