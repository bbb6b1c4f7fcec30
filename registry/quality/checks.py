"""Run a case's checks on one output (SPEC §16). Pure functions; no I/O.

- ``json_schema``: the output (surrounding whitespace stripped) must parse as JSON and validate
  against the schema (Draft 2020-12). The schema's ``pattern`` and ``patternProperties`` match
  like ``regex`` checks (the ``regex`` package, with the same timeout): a catastrophic pattern
  fails the check (``schema: pattern … timed out``) instead of hanging. A format check.
- ``regex``: ``regex.search`` (the ``regex`` package, not ``re``) with a timeout of
  :data:`REGEX_TIMEOUT_S` seconds of CPU time (what the package counts): a catastrophically
  backtracking pattern fails the check with reason ``regex timed out`` instead of hanging the
  evaluator. A format check.

- ``contains`` / ``not_contains``: case-sensitive substring.
- ``max_chars``: ``len(output) <= n`` (Unicode characters).
- ``refusal``: :func:`is_refusal` must equal ``expected`` (default false: the answer must not be a
  refusal).

A request that failed (no output) fails every check of its case, reason ``request failed``.

Every pattern match of one answer also draws on one budget, :data:`ANSWER_DEADLINE_S`, when the
caller sets it (:func:`run_groups`): the checks of one answer end by then, however many patterns
they hold. The hard bound, for whatever else a check could cost (a schema reaching stdlib ``re``
through ``additionalProperties`` next to ``patternProperties``, a nested ``$schema`` of another
draft), is the worker process that runs the checks, killed at the deadline
(:mod:`registry.quality.check_pool`).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import jsonschema
import regex
from jsonschema.exceptions import ValidationError

REGEX_TIMEOUT_S = 1.0
ANSWER_DEADLINE_S = 2.0  # every check of one answer (all its cases' format checks, in the canary)

# time.monotonic() by which the current answer's checks must end (None: each pattern alone is
# bounded by REGEX_TIMEOUT_S)
_deadline: ContextVar[float | None] = ContextVar("loraplane_check_deadline", default=None)

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


def _timeout() -> float:
    deadline = _deadline.get()
    if deadline is None:
        return REGEX_TIMEOUT_S
    return max(0.0, min(REGEX_TIMEOUT_S, deadline - time.monotonic()))


def _search(pattern: str, text: str) -> bool:
    """``regex.search`` bounded by the timeout; raises ``TimeoutError`` or ``regex.error``."""
    return _pattern(pattern).search(text, timeout=_timeout()) is not None


def _kw_pattern(validator: Any, patrn: str, instance: Any, schema: Any) -> Iterator[ValidationError]:
    if not validator.is_type(instance, "string"):
        return
    try:
        if not _search(patrn, instance):
            yield ValidationError(f"{instance!r} does not match {patrn!r}")
    except TimeoutError:
        yield ValidationError(f"pattern {patrn!r} timed out")
    except regex.error as e:
        yield ValidationError(f"pattern {patrn!r} does not compile: {e}")


def _kw_pattern_properties(
    validator: Any, properties: dict[str, Any], instance: Any, schema: Any
) -> Iterator[ValidationError]:
    if not validator.is_type(instance, "object"):
        return
    for patrn, subschema in properties.items():
        for key, value in instance.items():
            try:
                hit = _search(patrn, key)
            except TimeoutError:
                yield ValidationError(f"patternProperties {patrn!r} timed out on {key!r}")
                continue
            except regex.error as e:
                yield ValidationError(f"patternProperties {patrn!r} does not compile: {e}")
                break
            if hit:
                yield from validator.descend(value, subschema, path=key, schema_path=patrn)


# Draft 2020-12 whose pattern keywords match like the regex checks (bounded) instead of stdlib re
_BoundedValidator = jsonschema.validators.extend(
    jsonschema.Draft202012Validator,
    validators={"pattern": _kw_pattern, "patternProperties": _kw_pattern_properties},
)


def _validator(schema: Any) -> Any:
    return _BoundedValidator(schema)


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
            found = _search(check["pattern"], output)
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


def run_groups(
    groups: list[list[dict[str, Any]]], output: str | None, deadline_s: float = ANSWER_DEADLINE_S
) -> list[list[CheckResult]]:
    """Each group's checks on one output, every pattern match drawing on one ``deadline_s``
    budget (a pattern met once it is spent times out at once; checks without patterns run)."""
    token = _deadline.set(time.monotonic() + deadline_s)
    try:
        return [run_checks(checks, output) for checks in groups]
    finally:
        _deadline.reset(token)
