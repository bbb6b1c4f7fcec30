"""The checks and figures of an evaluation (SPEC §16), as pure functions: what each check type
accepts and refuses, the regex timeout guard, and the per-arm / pairwise figures and verdict."""

from __future__ import annotations

import json
import time
from typing import Any

from registry.quality.checks import REGEX_TIMEOUT_S, is_refusal, run_check, run_checks, run_groups
from registry.quality.results import STORED_OUTPUT_CHARS, Answer, arm_stats, pairwise, percentile, verdict

SCHEMA = {"type": "object", "required": ["answer"], "properties": {"answer": {"type": "string"}}}


def test_each_check_type() -> None:
    js = {"type": "json_schema", "schema": SCHEMA}
    assert run_check(js, ' {"answer": "ok"}\n').passed
    assert run_check(js, '{"answer": "cut').reason == "output is not valid JSON"
    bad = run_check(js, '{"answer": 3}')
    assert not bad.passed and bad.reason is not None and "not of type 'string'" in bad.reason
    assert run_check({"type": "regex", "pattern": r"order \d+"}, "your order 12 ships").passed
    assert run_check({"type": "regex", "pattern": r"^\d+$"}, "12a").reason == "no match"
    assert run_check({"type": "contains", "text": "refund"}, "a refund is due").passed
    assert not run_check({"type": "contains", "text": "Refund"}, "a refund is due").passed  # case-sensitive
    assert not run_check({"type": "not_contains", "text": "password"}, "the password is x").passed
    assert run_check({"type": "max_chars", "n": 5}, "héllo").passed
    assert run_check({"type": "max_chars", "n": 4}, "héllo").reason == "5 characters > 4"
    assert run_check({"type": "refusal", "expected": False}, "Sure, here it is").passed
    refused = run_check(
        {"type": "refusal", "expected": False}, "I'm sorry, but I can't assist with that request."
    )
    assert not refused.passed and refused.reason == "answer is a refusal"
    assert run_check({"type": "refusal", "expected": True}, "I cannot help with that request.").passed


def test_a_failed_request_fails_every_check() -> None:
    out = run_checks([{"type": "max_chars", "n": 10}, {"type": "not_contains", "text": "x"}], None)
    assert [(c.passed, c.reason) for c in out] == [(False, "request failed"), (False, "request failed")]


def test_catastrophic_regex_times_out_instead_of_hanging() -> None:
    t0 = time.monotonic()
    res = run_check({"type": "regex", "pattern": r"(a|aa)+$"}, "a" * 40 + "!")
    assert not res.passed and res.reason == "regex timed out"
    # the regex package's timeout counts CPU time: a loaded machine stretches the wall time
    assert time.monotonic() - t0 < REGEX_TIMEOUT_S * 30


def test_json_schema_patterns_match_with_the_regex_package_bounded_like_regex_checks() -> None:
    """``pattern`` and ``patternProperties`` of a json_schema check (issue 24.4): stdlib ``re``
    took 0.56 s for ``^(a+)+$`` on 24 characters and doubled per character; the ``regex``
    package answers at once, and a pattern it cannot tame times out like a regex check."""
    long_key = "a" * 26 + "!"  # stdlib re: ~2 s idle, far more on a loaded machine
    for schema, doc in (
        ({"type": "string", "pattern": r"^(a+)+$"}, json.dumps(long_key)),
        (
            {"type": "object", "patternProperties": {r"^(a+)+$": {"type": "integer"}}},
            json.dumps({long_key: "x"}),
        ),
    ):
        t0 = time.monotonic()
        res = run_check({"type": "json_schema", "schema": schema}, doc)
        assert time.monotonic() - t0 < 0.5
        assert res.passed == (schema["type"] == "object")  # no match: the string fails, the key is free
    slow = "a" * 40 + "!"
    for schema, doc, said in (
        ({"type": "string", "pattern": r"^(a|aa)+$"}, json.dumps(slow), "pattern '^(a|aa)+$' timed out"),
        (
            {"type": "object", "patternProperties": {r"^(a|aa)+$": {"type": "integer"}}},
            json.dumps({slow: 1}),
            "patternProperties '^(a|aa)+$' timed out",
        ),
    ):
        t0 = time.monotonic()
        res = run_check({"type": "json_schema", "schema": schema}, doc)
        assert not res.passed and res.reason is not None and said in res.reason, res
        assert time.monotonic() - t0 < REGEX_TIMEOUT_S * 30  # CPU time, as for regex checks


def test_one_answer_s_patterns_share_one_deadline() -> None:
    """Three catastrophic regex checks of one answer end within one answer's budget, not three
    timeouts; a check without a pattern still runs."""
    slow = {"type": "regex", "pattern": r"^(a|aa)+$"}
    t0 = time.process_time()  # what the regex package's timeout counts
    [got] = run_groups([[slow, slow, slow, {"type": "contains", "text": "a"}]], "a" * 40 + "!", 0.5)
    took = time.process_time() - t0
    assert [(r.passed, r.reason) for r in got] == [(False, "regex timed out")] * 3 + [(True, None)]
    assert took < 1.5, took  # one budget of 0.5 s, not 3 x REGEX_TIMEOUT_S (3 s)


def test_refusal_detection_follows_the_opening() -> None:
    for text in (
        "I can't help with that.",
        '  "I am unable to do that',
        "As an AI, I won't",
        "I’m sorry, no",
    ):
        assert is_refusal(text), text
    for text in ("Here is why I can't stop smiling", '{"answer": "I cannot"}', ""):
        assert not is_refusal(text), text


def _answer(output: str | None, latency: float, checks: list[dict[str, Any]]) -> Answer:
    a = Answer(output, latency if output is not None else None, None if output is not None else "502")
    a.checks = run_checks(checks, output)
    return a


def test_arm_figures_pairwise_and_verdict() -> None:
    js: dict[str, Any] = {"type": "json_schema", "schema": SCHEMA}
    short: dict[str, Any] = {"type": "max_chars", "n": 20}
    cand = [
        _answer('{"answer": "a"}', 10, [js, short]),
        _answer('{"answer": "b"', 20, [js, short]),  # format error
        _answer("I can't help with that.", 30, [short]),  # refusal, 23 chars > 20
        _answer(None, 0, [js]),  # request failed: fails, counts as a format error
    ]
    stats = arm_stats("m", cand)
    assert stats["pass_rate"] == 0.25 and stats["errors"] == 1
    assert stats["pass_rate_by_check"] == {"json_schema": round(1 / 3, 4), "max_chars": round(2 / 3, 4)}
    assert stats["format_error_rate"] == round(2 / 3, 4)
    assert stats["refusal_rate"] == round(1 / 3, 4)
    assert stats["mean_output_chars"] == round((15 + 14 + 23) / 3, 1)
    assert stats["latency_ms"] == {"p50": 20.0, "p99": 30.0}
    other = [
        _answer('{"answer": "a"}', 1, []),
        _answer('{"answer": "c"}', 1, []),
        _answer("something else", 1, []),
        _answer('{"answer": "d"}', 1, []),
    ]
    pw = pairwise(cand, other)
    assert pw["cases"] == 3 and pw["exact_match_rate"] == round(1 / 3, 4)
    assert 0 < pw["similarity"] < 1
    current = arm_stats("c", [_answer('{"answer": "a"}', 1, [js])] * 4)
    v = verdict({"base": None, "current": current, "candidate": stats}, {"min_pass_rate": 0.2})
    assert not v["passed"] and v["gate"] == "failed" and v["regression_pp"] == 75.0
    assert len(v["reasons"]) == 2  # regression and format errors; the pass rate is above 0.2
    v = verdict(
        {"base": None, "current": None, "candidate": stats},
        {"min_pass_rate": 0.2, "max_format_error_rate": 1},
    )
    assert v["passed"] and v["regression_pp"] is None and v["policy"]["max_regression_pp"] == 5.0


def test_percentile_nearest_rank() -> None:
    assert percentile([], 50) is None
    assert percentile([5.0], 99) == 5.0
    values = [float(i) for i in range(1, 101)]
    assert percentile(values, 50) == 50.0 and percentile(values, 99) == 99.0


def test_long_answers_are_checked_whole_and_stored_cut() -> None:
    text = '{"answer": "' + "x" * 5000 + '"}'
    a = _answer(text, 5, [{"type": "max_chars", "n": 4500}, {"type": "json_schema", "schema": SCHEMA}])
    assert [c.passed for c in a.checks] == [False, True]  # the whole answer, not the stored part
    stored = a.to_json()
    assert len(stored["output"]) == STORED_OUTPUT_CHARS and stored["output_chars"] == len(text)
    assert not stored["passed"]
