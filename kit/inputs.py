"""Hostile input stopped at the boundary (SPEC §5, §18: never a 500 for bad input).

Two field types for request schemas, one JSON walker and one ASGI middleware:

- :data:`SafeStr` — one line of text: no NUL and no other control character (C0 or DEL).
  :data:`SafeText` — free text: the same, except tab, line feed and carriage return.
  PostgreSQL refuses NUL in ``text`` and ``json`` values (a 500 before these types) and control
  characters in names break logs, terminals and the console.
- :data:`Int32` — a strict integer that fits a 32-bit ``INTEGER`` column (PostgreSQL answers
  "integer out of range" otherwise); fields add their own ``ge``/``le`` on top.
  :data:`UtcDatetime` / :func:`utc_time` — a time that UTC can hold (``since`` filters).
- :func:`json_problem` — the first problem in a parsed JSON value: nested deeper than
  ``MAX_JSON_DEPTH``, a string or key with NUL / control characters or a lone surrogate (JSON's
  ``"\ud800"``: neither database can encode it), a non-finite number.
- :class:`InputGuard` — checks, before the app sees the request, every query parameter (no
  control character at all; path parameters are the router's to name, see
  ``registry.api.inputs``), and a JSON or form body: at most ``max_body_bytes``
  (else 413), valid JSON (a nesting that would blow the parser's recursion is "nested too
  deeply"), and :func:`json_problem` for every value (else 422); a body of another type that
  parses as JSON is held to the same rules, JSON Lines line by line, a form field by field.
  ``multipart/form-data`` (artifact uploads, checked file by file by their own pipeline) passes
  through untouched.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Awaitable, Callable, MutableMapping
from datetime import UTC, datetime
from typing import Annotated, Any
from urllib.parse import parse_qsl

from pydantic import AfterValidator, Field, Strict

INT32_MAX = 2**31 - 1
INT32_MIN = -(2**31)
MAX_JSON_DEPTH = 32
MAX_BODY_BYTES = 8 * 1024 * 1024

_CONTROL = re.compile(r"[\x00-\x1f\x7f]")  # any C0 control or DEL: names, ids, filters, paths
_CONTROL_TEXT = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")  # free text keeps \t \n \r

_SURROGATE = re.compile(r"[\ud800-\udfff]")  # JSON's "\ud800" escapes: no UTF-8 for them

CONTROL_MESSAGE = "must not contain NUL or other control characters"
SURROGATE_MESSAGE = "must be valid Unicode (a lone surrogate has no UTF-8 form)"


def has_control(value: str, *, text: bool = False) -> bool:
    """True when ``value`` holds a NUL or another control character (``text``: tab, LF and CR
    are allowed)."""
    return (_CONTROL_TEXT if text else _CONTROL).search(value) is not None


def text_problem(value: str, *, text: bool = False) -> str | None:
    """Why ``value`` cannot be stored or shown as it is (control characters, lone surrogates,
    which neither database can encode), or None."""
    if has_control(value, text=text):
        return CONTROL_MESSAGE + (" (tab and newlines are allowed)" if text else "")
    if _SURROGATE.search(value) is not None:
        return SURROGATE_MESSAGE
    return None


def _safe_line(value: str) -> str:
    problem = text_problem(value)
    if problem is not None:
        raise ValueError(problem)
    return value


def _safe_text(value: str) -> str:
    problem = text_problem(value, text=True)
    if problem is not None:
        raise ValueError(problem)
    return value


# The JSON-schema pattern tells clients (and fuzzers) the rule; the validator gives the message.
SafeStr = Annotated[
    str, Strict(), AfterValidator(_safe_line), Field(json_schema_extra={"pattern": "^[^\\x00-\\x1f\\x7f]*$"})
]
SafeText = Annotated[
    str,
    Strict(),
    AfterValidator(_safe_text),
    Field(json_schema_extra={"pattern": "^[^\\x00-\\x08\\x0b\\x0c\\x0e-\\x1f\\x7f]*$"}),
]


def _int32(value: int) -> int:
    if not INT32_MIN <= value <= INT32_MAX:
        raise ValueError(f"must be between {INT32_MIN} and {INT32_MAX} (a 32-bit integer)")
    return value


# A validator, not Field(ge=, le=): a field's own ``Field(ge=1, le=100)`` would replace those
# bounds instead of adding to them.
Int32 = Annotated[int, Strict(), AfterValidator(_int32)]


def utc_time(value: datetime) -> datetime:
    """``value`` in UTC (naive times are UTC); ``ValueError`` when UTC cannot hold it (an offset
    past year 1 or 9999, which the databases' drivers would fail on: a 500 before)."""
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    try:
        out = value.astimezone(UTC)
        out.timestamp()  # the drivers' conversion overflows here too
    except (OverflowError, ValueError, OSError):
        raise ValueError("time out of range (years 1 to 9999 in UTC)") from None
    return out


UtcDatetime = Annotated[datetime, AfterValidator(utc_time)]


def json_problem(value: Any, *, max_depth: int = MAX_JSON_DEPTH) -> tuple[str, str] | None:
    """``(where, problem)`` for the first bad thing in a parsed JSON value, or None.

    ``where`` is a dotted path (``limits.rpm``, ``owners.0``); strings may hold tab, LF and CR."""
    stack: list[tuple[Any, str, int]] = [(value, "", 0)]
    while stack:
        v, where, depth = stack.pop()
        if depth > max_depth:
            return where, f"nested more than {max_depth} levels deep"
        if isinstance(v, str):
            problem = text_problem(v, text=True)
            if problem is not None:
                return where, problem
        elif isinstance(v, float):
            if not math.isfinite(v):
                return where, "numbers must be finite"
        elif isinstance(v, dict):
            for k, item in v.items():
                sub = f"{where}.{k}" if where else str(k)
                problem = text_problem(k)
                if problem is not None:
                    return (where or "body"), f"key {k!r} {problem}"
                stack.append((item, sub, depth + 1))
        elif isinstance(v, list):
            for i, item in enumerate(v):
                stack.append((item, f"{where}.{i}" if where else str(i), depth + 1))
    return None


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not allowed in JSON")


class JSONTooDeep(ValueError):
    """JSON nested deep enough to exhaust the parser's recursion."""


def parse_json(raw: bytes | str) -> Any:
    """``json.loads`` that refuses NaN / Infinity and turns a nesting deep enough to exhaust the
    parser's recursion into :class:`JSONTooDeep`, a ``ValueError`` (``json.loads`` raises
    ``RecursionError``, which callers catching ``ValueError`` would miss: a 500)."""
    try:
        return json.loads(raw, parse_constant=_reject_constant)
    except RecursionError:
        raise JSONTooDeep("JSON nested too deeply") from None


Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]
# (status, code, message, field) → the JSON error body in the API's own shape
Render = Callable[[int, str, str, str], bytes]


class _Refused(Exception):
    def __init__(self, status: int, code: str, message: str, field: str) -> None:
        super().__init__(message)
        self.status, self.code, self.message, self.field = status, code, message, field


def _invalid(message: str, field: str) -> _Refused:
    return _Refused(422, "invalid_request", message, field)


def _check_pairs(pairs: list[tuple[str, str]], where: str) -> None:
    for k, v in pairs:
        if has_control(k) or has_control(v):
            raise _invalid(f"{where} parameter {k!r} {CONTROL_MESSAGE}", f"{where}.{k}")


def _media_type(scope: Scope) -> str:
    for name, value in scope.get("headers", ()):
        if name == b"content-type":
            return str(value.decode("latin-1").split(";", 1)[0].strip().lower())
    return ""


def _is_json(media: str) -> bool:
    return media in ("", "application/json") or media.endswith("+json")


def _is_json_lines(media: str) -> bool:
    return media in ("application/x-ndjson", "application/jsonl", "application/x-jsonlines")


def _check_json(raw: bytes, field: str = "body", *, strict: bool = True) -> None:
    """``strict``: the body must be JSON; else only a body that parses (or nests too deeply to
    parse) is held to the rules — the route decides what other bodies mean."""
    try:
        value = parse_json(raw)
    except JSONTooDeep:
        raise _invalid("request body is not valid JSON: nested too deeply", field) from None
    except UnicodeDecodeError:
        if not strict:
            return
        raise _invalid("request body is not UTF-8", field) from None
    except ValueError:
        if not strict:
            return
        raise _invalid("request body is not valid JSON", field) from None
    problem = json_problem(value)
    if problem is not None:
        where, what = problem
        raise _invalid(f"{where or 'body'}: {what}", f"{field}.{where}" if where else field)


class InputGuard:
    """ASGI middleware: refuse control characters in the query, and oversized, too deep or unsafe
    JSON / form bodies, before the application (and its database) sees them.

    ``render`` writes the error body in the API's shape; the answer is ``application/json``."""

    def __init__(self, app: ASGIApp, *, render: Render, max_body_bytes: int = MAX_BODY_BYTES) -> None:
        self.app = app
        self.render = render
        self.max_body_bytes = max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        try:
            self._check_query(scope)
            media = _media_type(scope)
            if media.startswith("multipart/"):
                return await self.app(scope, receive, send)
            body = await self._read(scope, receive)
            if body:
                if _is_json(media):
                    _check_json(body)
                elif _is_json_lines(media):
                    for n, line in enumerate(body.splitlines(), 1):
                        if line.strip():
                            _check_json(line, f"body.line{n}")
                elif media == "application/x-www-form-urlencoded":
                    _check_pairs(parse_qsl(body.decode("latin-1"), keep_blank_values=True), "form")
                else:  # e.g. text/plain: held to the same rules if it is JSON after all
                    _check_json(body, strict=False)
        except _Refused as r:
            return await self._refuse(send, r)
        await self.app(scope, _replay(body, receive), send)

    def _check_query(self, scope: Scope) -> None:
        qs: bytes = scope.get("query_string", b"")
        if qs:
            _check_pairs(parse_qsl(qs.decode("latin-1"), keep_blank_values=True), "query")

    async def _read(self, scope: Scope, receive: Receive) -> bytes:
        for name, value in scope.get("headers", ()):
            if name == b"content-length" and value.isdigit() and int(value) > self.max_body_bytes:
                raise self._too_large()
        chunks: list[bytes] = []
        size = 0
        while True:
            msg = await receive()
            if msg["type"] != "http.request":  # a disconnect: let the app see an empty body
                break
            chunk = msg.get("body", b"")
            size += len(chunk)
            if size > self.max_body_bytes:
                raise self._too_large()
            chunks.append(chunk)
            if not msg.get("more_body", False):
                break
        return b"".join(chunks)

    def _too_large(self) -> _Refused:
        return _Refused(
            413, "payload_too_large", f"request body larger than {self.max_body_bytes} bytes", "body"
        )

    async def _refuse(self, send: Send, r: _Refused) -> None:
        body = self.render(r.status, r.code, r.message, r.field)
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
        await send({"type": "http.response.start", "status": r.status, "headers": headers})
        await send({"type": "http.response.body", "body": body})


def _replay(body: bytes, receive: Receive) -> Receive:
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()  # after the body: the server's disconnect, as usual

    return replay
