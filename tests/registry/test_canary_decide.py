"""Canary analysis decisions, in-process and fast (SPEC §16): the one-sided tests, the looks of a
window, and the two properties an operator relies on — a canary 5 points worse is aborted within
its window, a healthy one is never aborted over a long run (20 seeded runs each)."""

from __future__ import annotations

import math
import random
from collections import Counter

import pytest

from kit.errors import InvalidRequest
from registry.canary.counters import ArmCounts
from registry.canary.decide import MIN_CHECKED, CheckCounts, alpha_of_look, due_look, judge
from registry.canary.policy import ALPHA, CanaryPolicy, check_canary_policy
from registry.canary.sketch import bucket_of, quantile, upper_edge
from registry.canary.stats import error_rate_p_value, mann_whitney_greater


def _traffic(rng: random.Random, n: int, error_rate: float, ttft_median_s: float) -> ArmCounts:
    out = ArmCounts()
    for _ in range(n):
        out.requests += 1
        if rng.random() < error_rate:
            out.errors += 1
        else:
            out.ttft[bucket_of(ttft_median_s * math.exp(rng.gauss(0.0, 0.5)))] += 1
    return out


def _run(
    seed: int,
    policy: CanaryPolicy,
    *,
    canary_error: float,
    active_error: float = 0.01,
    canary_ttft: float = 0.05,
    windows: int = 1,
    per_tick: int = 40,
    ticks_per_window: int = 100,
) -> tuple[int | None, list[str]]:
    """Feed a canary (10 % of traffic) and its active version tick by tick, looking as the
    analyser does; the index of the tick that breached (and why), or None."""
    rng = random.Random(seed)
    tick = 0
    for _ in range(windows):
        canary, active, next_look = ArmCounts(), ArmCounts(), 0
        for _ in range(ticks_per_window):
            tick += 1
            canary.add(_traffic(rng, per_tick, canary_error, canary_ttft))
            active.add(_traffic(rng, per_tick * 9, active_error, 0.05))
            look = due_look(min(canary.requests, active.requests), policy.min_requests, next_look)
            if look is None:
                continue
            next_look = look + 1
            verdict = judge(policy, canary, active, look=look)
            if verdict.breach:
                return tick, verdict.reasons
    return None, []


def test_looks_spend_at_most_alpha_per_window() -> None:
    assert sum(alpha_of_look(j) for j in range(60)) <= ALPHA
    assert due_look(99, 100, 0) is None
    assert due_look(100, 100, 0) == 0
    assert due_look(399, 100, 0) == 1
    assert due_look(400, 100, 0) == 2
    assert due_look(399, 100, 2) is None  # look 1 was passed by; look 2 not reached yet


def test_error_rate_test_is_one_sided_and_honours_the_margin() -> None:
    assert error_rate_p_value(1000, 70, 1000, 20, 0.0) < 1e-6  # 7 % vs 2 %
    assert error_rate_p_value(1000, 20, 1000, 70, 0.0) > 0.999  # the canary is *better*
    assert error_rate_p_value(1000, 0, 1000, 0, 0.0) > 0.4  # no errors anywhere: nothing to see
    # 7 % vs 2 % is 5 points: significant against a 2-point margin, not against a 6-point one
    assert error_rate_p_value(2000, 140, 2000, 40, 0.02) < 0.001
    assert error_rate_p_value(2000, 140, 2000, 40, 0.06) > 0.5


def test_mann_whitney_on_sketches() -> None:
    rng = random.Random(7)
    slow = _traffic(rng, 500, 0.0, 0.1)
    fast = _traffic(rng, 500, 0.0, 0.05)
    same = _traffic(rng, 500, 0.0, 0.05)
    assert mann_whitney_greater(slow.ttft, fast.ttft) < 1e-9
    assert mann_whitney_greater(fast.ttft, slow.ttft) > 0.999
    assert 0.001 < mann_whitney_greater(same.ttft, fast.ttft) < 0.999
    # one tie group only: no evidence either way
    assert mann_whitney_greater(Counter({5: 10}), Counter({5: 10})) >= 0.5


def test_sketch_quantiles_within_one_bucket() -> None:
    values = [0.001 * (i + 1) for i in range(1000)]  # 1 ms … 1 s
    hist = Counter(bucket_of(v) for v in values)
    p99 = quantile(hist, 0.99)
    assert p99 is not None and 0.99 <= p99 <= 0.99 * 1.05 + 1e-9
    assert quantile(Counter(), 0.99) is None
    assert bucket_of(0.0) == 0 and bucket_of(float("nan")) == 0
    assert upper_edge(bucket_of(2.5)) >= 2.5


def test_policy_defaults_and_every_problem_listed() -> None:
    stored = check_canary_policy({"min_requests": 50, "auto_promote_after_s": 600})
    assert stored == {**CanaryPolicy().to_dict(), "min_requests": 50, "auto_promote_after_s": 600.0}
    assert check_canary_policy(None) is None
    with pytest.raises(InvalidRequest) as e:
        check_canary_policy(
            {"min_requests": 0, "max_error_rate_delta": 1.5, "max_ttft_p99_ratio": 0.5,
             "window_s": True, "auto_promote_after_s": -1, "colour": "red"}
        )  # fmt: skip
    problems = e.value.details["problems"]
    assert len(problems) == 6, problems
    assert any("colour" in p for p in problems)
    with pytest.raises(InvalidRequest):
        check_canary_policy([1, 2])


POLICY = CanaryPolicy(min_requests=200, max_error_rate_delta=0.0, max_ttft_p99_ratio=1.5, window_s=600)


@pytest.mark.parametrize("seed", range(20))
def test_a_canary_five_points_worse_is_aborted_within_its_window(seed: int) -> None:
    tick, reasons = _run(seed, POLICY, canary_error=0.06)
    assert tick is not None, "a canary with 5 points more errors was not caught in its window"
    assert reasons == ["error_rate"]


@pytest.mark.parametrize("seed", range(20))
def test_a_healthy_canary_is_never_aborted_over_a_long_run(seed: int) -> None:
    # ten windows of 36,000 requests each (3,600 canary answers per window), same error rate and
    # TTFT distribution in both arms
    tick, reasons = _run(seed, POLICY, canary_error=0.01, windows=10)
    assert tick is None, f"false alarm at tick {tick}: {reasons}"


@pytest.mark.parametrize("seed", range(5))
def test_a_slower_canary_is_aborted_on_ttft(seed: int) -> None:
    tick, reasons = _run(seed, POLICY, canary_error=0.01, canary_ttft=0.1)
    assert tick is not None and reasons == ["ttft"]


def test_the_evidence_names_counts_rates_and_p_values() -> None:
    rng = random.Random(3)
    canary, active = _traffic(rng, 400, 0.07, 0.05), _traffic(rng, 3600, 0.01, 0.05)
    v = judge(POLICY, canary, active, look=1)
    assert v.breach and v.reasons == ["error_rate"]
    ev = v.evidence
    assert ev["canary"]["requests"] == 400 and ev["active"]["requests"] == 3600
    assert ev["canary"]["errors"] == canary.errors
    assert ev["canary"]["error_rate"] == round(canary.errors / 400, 6)
    assert ev["tests"]["error_rate"]["p_value"] < ev["alpha"] == alpha_of_look(1) / 2
    assert ev["tests"]["ttft"]["breach"] is False and "p_value" in ev["tests"]["ttft"]


def test_format_checks_join_the_look_once_each_arm_has_enough_checked_answers() -> None:
    rng = random.Random(5)
    canary, active = _traffic(rng, 400, 0.01, 0.05), _traffic(rng, 3600, 0.01, 0.05)
    few = CheckCounts(canary_checked=MIN_CHECKED - 1, canary_failed=20, active_checked=500, active_failed=0)
    v = judge(POLICY, canary, active, look=0, checks=few)
    assert not v.breach and "format_checks" not in v.evidence["tests"]
    enough = CheckCounts(canary_checked=100, canary_failed=20, active_checked=500, active_failed=5)
    v = judge(POLICY, canary, active, look=0, checks=enough)
    assert v.reasons == ["format_checks"]
    assert v.evidence["alpha"] == pytest.approx(alpha_of_look(0) / 3, rel=1e-5)  # three tests share α
    assert v.evidence["tests"]["format_checks"]["canary"]["failure_rate"] == 0.2
