"""Run a case's checks on one output (SPEC §16). Pure functions; no I/O.

- ``json_schema``: the output (surrounding whitespace stripped) must parse as JSON and validate
  against the schema (Draft 2020-12). A format check.
- ``regex``: ``regex.search`` (the ``regex`` package, not ``re``) with a timeout of
  :data:`REGEX_TIMEOUT_S` seconds of CPU time (what the package counts): a catastrophically
  backtracking pattern fails the check with reason ``regex timed out`` instead of hanging the
  evaluator. A format check.
- ``contains`` / ``not_contains``: case-sensitive substring.
- ``max_chars``: ``len(output) <= n`` (Unicode characters).
- ``refusal``: :func:`is_refusal` must equal ``expected`` (default false: the answer must not be a
  refusal).

A request that failed (no output) fails every check of its case, reason ``request failed``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import jsonschema
import regex

REGEX_TIMEOUT_S = 1.0

# Openings of the refusals an instruction-tuned model (and the simulator) gives. A refusal is an
# answer that *starts* with one of these, after leading whitespace and quotes, case-insensitive.
REFUSAL_OPENINGS = (
    "i can't",
    "i cannot",
    "i can not",
    "i won't",
    "i'm sorry",
    "i am sorry",
    "sorry, i",
    "i'm unable",
    "i am unable",
    "i'm not able",
    "i am not able",
    "as an ai",
)


@dataclass(frozen=True, slots=True)
class CheckResult:
    type: str
    passed: bool
    reason: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"type": self.type, "passed": self.passed, "reason": self.reason}


def is_refusal(output: str) -> bool:
    head = output.lstrip(" \t\r\n\"'“").lower().replace("’", "'")
    return head.startswith(REFUSAL_OPENINGS)


@lru_cache(maxsize=512)
def _pattern(pattern: str) -> Any:
    return regex.compile(pattern)


def _validator(schema: Any) -> jsonschema.Draft202012Validator:
    return jsonschema.Draft202012Validator(schema)


def run_check(check: dict[str, Any], output: str) -> CheckResult:
    kind = str(check["type"])
    if kind == "json_schema":
        try:
            doc = json.loads(output.strip())
        except (ValueError, RecursionError):
            return CheckResult(kind, False, "output is not valid JSON")
        error = jsonschema.exceptions.best_match(_validator(check["schema"]).iter_errors(doc))
        if error is not None:
            return CheckResult(kind, False, f"schema: {error.message}"[:300])
        return CheckResult(kind, True)
    if kind == "regex":
        try:
            found = _pattern(check["pattern"]).search(output, timeout=REGEX_TIMEOUT_S)
        except TimeoutError:
            return CheckResult(kind, False, "regex timed out")
        return CheckResult(kind, True) if found else CheckResult(kind, False, "no match")
    if kind == "contains":
        ok = check["text"] in output
        return CheckResult(kind, ok, None if ok else "text not found")
    if kind == "not_contains":
        ok = check["text"] not in output
        return CheckResult(kind, ok, None if ok else "forbidden text found")
    if kind == "max_chars":
        ok = len(output) <= int(check["n"])
        return CheckResult(kind, ok, None if ok else f"{len(output)} characters > {check['n']}")
    if kind == "refusal":
        expected = bool(check.get("expected", False))
        got = is_refusal(output)
        if got == expected:
            return CheckResult(kind, True)
        return CheckResult(kind, False, "answer is a refusal" if got else "answer is not a refusal")
    return CheckResult(kind, False, f"unknown check type {kind!r}")


def run_checks(checks: list[dict[str, Any]], output: str | None) -> list[CheckResult]:
    if output is None:
        return [CheckResult(str(c["type"]), False, "request failed") for c in checks]
    return [run_check(c, output) for c in checks]
