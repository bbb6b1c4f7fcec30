"""The check pool (issue 24.4): checks run in worker processes with a deadline per answer. An
answer whose checks cannot be bounded in-process (a JSON Schema that reaches stdlib ``re``,
which also holds the GIL) is cut off at the deadline, its worker replaced, and the caller's
event loop keeps running meanwhile."""

from __future__ import annotations

import asyncio
import json
import time

import pytest

from registry.quality.check_pool import TIMED_OUT, CheckPool
from registry.quality.checks import CheckResult

# additionalProperties beside patternProperties: jsonschema matches the joined patterns with
# stdlib re, outside the bounded keywords (2^28 steps: ~9 s idle)
ESCAPING = {
    "type": "json_schema",
    "schema": {"patternProperties": {r"^(a+)+$": {}}, "additionalProperties": False},
}
ESCAPING_DOC = json.dumps({"a" * 28 + "!": 1})


@pytest.mark.slow
def test_an_answer_past_its_deadline_is_cut_off_and_the_worker_replaced() -> None:
    pool = CheckPool(workers=1, deadline_s=1.0, grace_s=0.25)

    async def main() -> tuple[float, int, list[list[CheckResult]]]:
        # a worker started, and in use: the deadline counts from the answer, not the start
        ok = await pool.run([{"type": "contains", "text": "a"}], "abc")
        assert [r.passed for r in ok] == [True]
        ticks = 0

        async def ticker() -> None:
            nonlocal ticks
            while True:
                await asyncio.sleep(0.01)
                ticks += 1

        t = asyncio.create_task(ticker())
        t0 = time.monotonic()
        cut = await pool.run([ESCAPING, {"type": "contains", "text": "a"}], ESCAPING_DOC)
        took = time.monotonic() - t0
        t.cancel()
        after = await pool.run([ESCAPING], json.dumps({"b": 1}))  # a fresh worker answers
        return took, ticks, [cut, after]

    try:
        took, ticks, (cut, after) = asyncio.run(main())
    finally:
        pool.close()
    assert [(r.type, r.passed, r.reason) for r in cut] == [
        ("json_schema", False, f"{TIMED_OUT} after 1 s"),
        ("contains", False, f"{TIMED_OUT} after 1 s"),
    ]
    assert took < 1.25 + 2.0, took  # the deadline and grace, plus scheduling on a busy machine
    assert ticks >= 20, ticks  # the event loop ran all along (stdlib re held a thread's GIL: 0)
    assert [r.passed for r in after] == [False]
    assert pool.timeouts == 1


def test_a_failed_request_needs_no_worker_and_results_keep_their_order() -> None:
    pool = CheckPool(workers=2)

    async def main() -> tuple[list[CheckResult], list[list[CheckResult]]]:
        failed = await pool.run([{"type": "max_chars", "n": 3}], None)
        groups = await pool.run_groups(
            [
                [{"type": "regex", "pattern": "^x"}],
                [{"type": "max_chars", "n": 3}, {"type": "contains", "text": "z"}],
            ],
            "xyz",
        )
        return failed, groups

    try:
        failed, groups = asyncio.run(main())
    finally:
        pool.close()
    assert [(r.passed, r.reason) for r in failed] == [(False, "request failed")]
    assert [[(r.type, r.passed) for r in g] for g in groups] == [
        [("regex", True)],
        [("max_chars", True), ("contains", True)],
    ]
