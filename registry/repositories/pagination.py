"""Keyset pagination with opaque cursors: ``limit`` (default 50, clamped to 500) and ``cursor``."""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from kit.errors import InvalidRequest

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
        key = json.loads(raw)["k"]
    except (binascii.Error, ValueError, KeyError, TypeError, UnicodeDecodeError):
        raise InvalidRequest("invalid cursor", details={"field": "cursor"}) from None
    if not isinstance(key, kind) or isinstance(key, bool):
        raise InvalidRequest("invalid cursor", details={"field": "cursor"})
    return key


def page_of(rows: Sequence[T], limit: int, key_of: Any) -> tuple[list[T], str | None]:
    """Given up to ``limit + 1`` rows, the page and the cursor of the next one."""
    items = list(rows[:limit])
    more = len(rows) > limit
    return items, (encode_cursor(key_of(items[-1])) if more and items else None)
