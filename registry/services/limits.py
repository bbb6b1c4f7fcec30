"""Limits of one level (adapter, owner): ``rpm``, ``tpm``, ``max_concurrency``, each a
non-negative integer that fits the database column, or null (unlimited)."""

from __future__ import annotations

from typing import Any

from kit.errors import InvalidRequest

LIMIT_KEYS = ("rpm", "tpm", "max_concurrency")
LIMIT_MAX = 2**31 - 1  # INTEGER column on PostgreSQL


def check_limits(limits: Any) -> dict[str, int | None]:
    """The limits a caller sent (any subset of :data:`LIMIT_KEYS`), checked; 422 otherwise."""
    if not isinstance(limits, dict):
        raise InvalidRequest("limits must be an object", details={"field": "limits"})
    out: dict[str, int | None] = {}
    for k, v in limits.items():
        if k not in LIMIT_KEYS:
            raise InvalidRequest(
                f"unknown limit {k!r} (known: rpm, tpm, max_concurrency)", details={"field": k}
            )
        if v is not None and (not isinstance(v, int) or isinstance(v, bool) or not 0 <= v <= LIMIT_MAX):
            raise InvalidRequest(
                f"limit {k} must be an integer from 0 to {LIMIT_MAX}, or null", details={"field": k}
            )
        out[k] = v
    return out
