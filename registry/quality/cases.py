"""Parse and validate a regression set (SPEC §16); every problem is listed, nothing is stored on
any problem.

A set is a JSON array of cases or JSON Lines (one case per line; blank lines skipped). A case::

    {"id": "refund-1", "messages": [{"role": "user", "content": "…"}] | "prompt": "…",
     "max_tokens": 128, "expected": "…", "checks": [{"type": "json_schema", "schema": {…}}, …]}

Checks: ``json_schema`` (``schema``: checked with ``Draft202012Validator.check_schema`` here, so a
bad schema is a problem at upload), ``regex`` (``pattern``: compiled here with the ``regex``
package; matching runs with a timeout, :mod:`registry.quality.checks`), ``contains`` /
``not_contains`` (``text``), ``max_chars`` (``n``), ``refusal`` (``expected``: bool, default
false). Unknown keys are problems (a typo must not silently turn a check off).

:func:`parse_set` returns the normalised cases and their sha256 (canonical JSON: sorted keys,
compact separators, UTF-8), or raises ``InvalidRequest`` with ``details.problems``.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import jsonschema
import regex

from kit.errors import InvalidRequest

MAX_SET_BYTES = 8 * 1024 * 1024
MAX_CASES = 2000
MAX_TOKENS_LIMIT = 32768
MAX_PATTERN_CHARS = 2000
MAX_PROBLEMS = 200
CHECK_TYPES = ("json_schema", "regex", "contains", "not_contains", "max_chars", "refusal")
FORMAT_CHECKS = frozenset({"json_schema", "regex"})
ROLES = ("system", "user", "assistant", "tool", "developer")
_CASE_KEYS = frozenset({"id", "messages", "prompt", "max_tokens", "expected", "checks"})
_CHECK_KEYS: dict[str, frozenset[str]] = {
    "json_schema": frozenset({"type", "schema"}),
    "regex": frozenset({"type", "pattern"}),
    "contains": frozenset({"type", "text"}),
    "not_contains": frozenset({"type", "text"}),
    "max_chars": frozenset({"type", "n"}),
    "refusal": frozenset({"type", "expected"}),
}


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not allowed in JSON")


def _loads(text: str) -> Any:
    return json.loads(text, parse_constant=_no_constant)


def split_body(body: bytes) -> tuple[list[tuple[str, Any]], list[str]]:
    """``[(where, raw case)]`` from a JSON array or JSON Lines body, and the problems met."""
    if len(body) > MAX_SET_BYTES:
        raise InvalidRequest(
            f"the regression set is over {MAX_SET_BYTES} bytes",
            details={"problems": [f"body is {len(body)} bytes, the limit is {MAX_SET_BYTES}"]},
        )
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        raise InvalidRequest(
            "the regression set is not UTF-8", details={"problems": ["body is not UTF-8"]}
        ) from None
    stripped = text.strip()
    if not stripped:
        raise InvalidRequest("the regression set is empty", details={"problems": ["no cases"]})
    if stripped.startswith("["):
        try:
            items = _loads(stripped)
        except (ValueError, RecursionError) as e:
            raise InvalidRequest(
                "the regression set is not valid JSON", details={"problems": [f"JSON array: {e}"]}
            ) from None
        return [(f"case {i + 1}", item) for i, item in enumerate(items)], []
    out: list[tuple[str, Any]] = []
    problems: list[str] = []
    for n, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            out.append((f"line {n}", _loads(line)))
        except (ValueError, RecursionError) as e:
            problems.append(f"line {n}: not valid JSON ({e})")
    return out, problems


def _check_messages(where: str, messages: Any, problems: list[str]) -> None:
    if not isinstance(messages, list) or not messages:
        problems.append(f"{where}: messages must be a non-empty list")
        return
    for i, m in enumerate(messages):
        at = f"{where}: messages[{i}]"
        if not isinstance(m, dict):
            problems.append(f"{at} must be an object")
            continue
        if m.get("role") not in ROLES:
            problems.append(f"{at}.role must be one of {', '.join(ROLES)}")
        if not isinstance(m.get("content"), str):
            problems.append(f"{at}.content must be a string")
        extra = sorted(set(m) - {"role", "content", "name"})
        if extra:
            problems.append(f"{at}: unknown keys {extra}")


def _check_one(at: str, check: Any, problems: list[str]) -> None:
    if not isinstance(check, dict):
        problems.append(f"{at} must be an object")
        return
    kind = check.get("type")
    if kind not in _CHECK_KEYS:
        problems.append(f"{at}.type must be one of {', '.join(CHECK_TYPES)} (got {kind!r})")
        return
    extra = sorted(set(check) - _CHECK_KEYS[kind])
    if extra:
        problems.append(f"{at}: unknown keys {extra} for a {kind} check")
    if kind == "json_schema":
        schema = check.get("schema")
        if not isinstance(schema, dict | bool):
            problems.append(f"{at}.schema must be a JSON Schema object")
            return
        try:
            jsonschema.Draft202012Validator.check_schema(schema)
        except jsonschema.SchemaError as e:
            path = "/".join(str(p) for p in e.path) or "(root)"
            problems.append(f"{at}.schema is not a valid JSON Schema at {path}: {e.message}")
    elif kind == "regex":
        pattern = check.get("pattern")
        if not isinstance(pattern, str) or not pattern:
            problems.append(f"{at}.pattern must be a non-empty string")
        elif len(pattern) > MAX_PATTERN_CHARS:
            problems.append(f"{at}.pattern is over {MAX_PATTERN_CHARS} characters")
        else:
            try:
                regex.compile(pattern)
            except (regex.error, RecursionError, OverflowError) as e:
                problems.append(f"{at}.pattern does not compile: {e}")
    elif kind in ("contains", "not_contains"):
        if not isinstance(check.get("text"), str) or not check.get("text"):
            problems.append(f"{at}.text must be a non-empty string")
    elif kind == "max_chars":
        n = check.get("n")
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            problems.append(f"{at}.n must be a positive integer")
    elif kind == "refusal" and "expected" in check and not isinstance(check["expected"], bool):
        problems.append(f"{at}.expected must be true or false")


def _check_case(where: str, case: Any, seen: dict[str, str], problems: list[str]) -> dict[str, Any] | None:
    if not isinstance(case, dict):
        problems.append(f"{where}: a case must be a JSON object")
        return None
    start = len(problems)
    cid = case.get("id")
    if not isinstance(cid, str) or not cid.strip() or len(cid) > 200:
        problems.append(f"{where}: id must be a non-empty string of at most 200 characters")
    else:
        if cid in seen:
            problems.append(f"{where}: id {cid!r} is already used by {seen[cid]}")
        seen.setdefault(cid, where)
        where = f"{where} (id {cid!r})"
    extra = sorted(set(case) - _CASE_KEYS)
    if extra:
        problems.append(f"{where}: unknown keys {extra}")
    has_m, has_p = "messages" in case, "prompt" in case
    if has_m == has_p:
        problems.append(f"{where}: exactly one of messages or prompt is required")
    elif has_m:
        _check_messages(where, case["messages"], problems)
    elif not isinstance(case["prompt"], str) or not case["prompt"]:
        problems.append(f"{where}: prompt must be a non-empty string")
    mt = case.get("max_tokens")
    if mt is not None and (
        isinstance(mt, bool) or not isinstance(mt, int) or not 1 <= mt <= MAX_TOKENS_LIMIT
    ):
        problems.append(f"{where}: max_tokens must be an integer from 1 to {MAX_TOKENS_LIMIT}")
    if case.get("expected") is not None and not isinstance(case["expected"], str):
        problems.append(f"{where}: expected must be a string")
    checks = case.get("checks", [])
    if not isinstance(checks, list):
        problems.append(f"{where}: checks must be a list")
        checks = []
    for i, check in enumerate(checks):
        _check_one(f"{where}: checks[{i}]", check, problems)
    if len(problems) > start:
        return None
    out: dict[str, Any] = {"id": cid, "checks": [dict(c) for c in checks]}
    for c in out["checks"]:
        if c["type"] == "refusal":
            c.setdefault("expected", False)
    for key in ("messages", "prompt", "max_tokens", "expected"):
        if case.get(key) is not None:
            out[key] = case[key]
    return out


def canonical_sha256(cases: list[dict[str, Any]]) -> str:
    text = json.dumps(cases, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def parse_set(body: bytes) -> tuple[list[dict[str, Any]], str]:
    """Normalised cases and their sha256; ``InvalidRequest`` listing every problem otherwise."""
    raw, problems = split_body(body)
    if not raw and not problems:
        problems.append("no cases")
    if len(raw) > MAX_CASES:
        problems.append(f"{len(raw)} cases, the limit is {MAX_CASES}")
        raw = raw[:MAX_CASES]
    seen: dict[str, str] = {}
    cases = [c for where, item in raw if (c := _check_case(where, item, seen, problems)) is not None]
    if problems:
        shown = problems[:MAX_PROBLEMS]
        if len(problems) > MAX_PROBLEMS:
            shown.append(f"… and {len(problems) - MAX_PROBLEMS} more")
        raise InvalidRequest(
            f"the regression set has {len(problems)} problem(s)", details={"problems": shown}
        )
    return cases, canonical_sha256(cases)
