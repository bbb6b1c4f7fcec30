"""Keyset pagination with opaque cursors: ``limit`` (default 50, clamped to 500) and ``cursor``.

:func:`keyset_rows` is the one query of a page (``limit + 1`` rows after the cursor's key);
:func:`page_of` cuts them into the page and the next cursor."""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import sqlalchemy as sa
from sqlalchemy.orm import InstrumentedAttribute, Session

from kit.errors import InvalidRequest
from kit.inputs import INT32_MAX, INT32_MIN, parse_json, text_problem

DEFAULT_LIMIT = 50
MAX_LIMIT = 500

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Page(Generic[T]):
    data: list[T]
    next_cursor: str | None


def clamp_limit(limit: int | None) -> int:
    if limit is None:
        return DEFAULT_LIMIT
    if limit < 1:
        raise InvalidRequest("limit must be at least 1", details={"field": "limit"})
    return min(limit, MAX_LIMIT)


def encode_cursor(key: Any) -> str:
    return base64.urlsafe_b64encode(json.dumps({"k": key}).encode()).decode().rstrip("=")


def decode_cursor(cursor: str | None, kind: type) -> Any:
    """The last key of the previous page, or None; a malformed cursor is a 422."""
    if not cursor:
        return None
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        key = parse_json(raw)["k"]  # a nesting too deep is a ValueError here, not a RecursionError
    except (binascii.Error, ValueError, KeyError, TypeError, UnicodeDecodeError):
        raise InvalidRequest("invalid cursor", details={"field": "cursor"}) from None
    if not isinstance(key, kind) or isinstance(key, bool):
        raise InvalidRequest("invalid cursor", details={"field": "cursor"})
    # a forged cursor: a key no row can have (NUL, a lone surrogate, past the INTEGER column)
    if (isinstance(key, str) and text_problem(key) is not None) or (
        isinstance(key, int) and not INT32_MIN <= key <= INT32_MAX
    ):
        raise InvalidRequest("invalid cursor", details={"field": "cursor"})
    return key


def page_of(rows: Sequence[T], limit: int, key_of: Any) -> tuple[list[T], str | None]:
    """Given up to ``limit + 1`` rows, the page and the cursor of the next one."""
    items = list(rows[:limit])
    more = len(rows) > limit
    return items, (encode_cursor(key_of(items[-1])) if more and items else None)


def keyset_rows(
    session: Session,
    entity: type[T],
    key: InstrumentedAttribute[Any],
    *,
    limit: int,
    after: Any = None,
    equal: Iterable[tuple[InstrumentedAttribute[Any], Any]] = (),
    where: Iterable[sa.ColumnElement[bool]] = (),
    descending: bool = False,
) -> list[T]:
    """Up to ``limit + 1`` rows of ENTITY in KEY order with KEY > ``after`` (when given), so the
    caller knows if there are more; with ``descending``, in reverse KEY order with KEY <
    ``after``. ``equal``: (column, value) filters applied when the value is given (not None or
    empty); ``where``: further conditions."""
    q = sa.select(entity).order_by(key.desc() if descending else key).limit(limit + 1)
    if after is not None:
        q = q.where(key < after if descending else key > after)
    for column, value in equal:
        if value:
            q = q.where(column == value)
    for condition in where:
        q = q.where(condition)
    return list(session.execute(q).scalars())
