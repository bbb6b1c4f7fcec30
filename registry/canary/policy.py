"""The ``canary_policy`` of an adapter (SPEC §16): validation and the record the analyser reads.

``PATCH /adapters/{id}`` with ``{"canary_policy": {...}}`` stores the policy whole (keys left out
take the defaults below); ``{"canary_policy": null}`` removes it, and the adapter's canaries run
unwatched again. Every problem of a bad policy is listed in one 422 ``invalid_request``.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from kit.errors import InvalidRequest

ALPHA = 0.01  # significance of the one-sided tests (SPEC §16), shared by all looks of a window


@dataclass(frozen=True, slots=True)
class CanaryPolicy:
    min_requests: int = 200  # answers each arm needs in the window before the first test
    max_error_rate_delta: float = 0.0  # allowed error-rate increase of the canary (0.02 = 2 points)
    max_ttft_p99_ratio: float = 1.5  # allowed canary/active ratio of TTFT p99
    max_check_failure_rate_delta: float = 0.0  # allowed increase of sampled format-check failures
    window_s: float = 600.0  # evidence window: each window's looks share α (then a fresh window)
    auto_promote_after_s: float | None = None  # promote after this long without breach (None: never)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def of(cls, data: dict[str, Any]) -> CanaryPolicy:
        """From a stored (already validated) policy; unknown keys are ignored."""
        fields = {k: data[k] for k in cls.__dataclass_fields__ if k in data}
        return cls(**fields)


_RATE_KEYS = ("max_error_rate_delta", "max_check_failure_rate_delta")


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def check_canary_policy(value: Any) -> dict[str, Any] | None:
    """The policy as stored (every key, defaults filled in), or None to remove it.

    Raises ``InvalidRequest`` listing every problem (``details.problems``)."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise InvalidRequest(
            "canary_policy must be an object or null", details={"field": "canary_policy", "problems": []}
        )
    problems: list[str] = []
    known = CanaryPolicy.__dataclass_fields__
    for key in value:
        if key not in known:
            problems.append(f"unknown key {key!r} (known: {', '.join(known)})")
    out = CanaryPolicy().to_dict()
    if "min_requests" in value:
        v = value["min_requests"]
        if not isinstance(v, int) or isinstance(v, bool) or not 10 <= v <= 10_000_000:
            problems.append("min_requests must be an integer from 10 to 10000000")
        else:
            out["min_requests"] = v
    for key in _RATE_KEYS:
        if key in value:
            v = value[key]
            if not _number(v) or not 0 <= v < 1:
                problems.append(f"{key} must be a number from 0 to below 1 (0.02 = 2 percentage points)")
            else:
                out[key] = float(v)
    if "max_ttft_p99_ratio" in value:
        v = value["max_ttft_p99_ratio"]
        if not _number(v) or not 1 <= v <= 1000:
            problems.append("max_ttft_p99_ratio must be a number from 1 to 1000")
        else:
            out["max_ttft_p99_ratio"] = float(v)
    if "window_s" in value:
        v = value["window_s"]
        if not _number(v) or not 10 <= v <= 30 * 86400:
            problems.append("window_s must be a number of seconds from 10 to 2592000 (30 days)")
        else:
            out["window_s"] = float(v)
    if "auto_promote_after_s" in value:
        v = value["auto_promote_after_s"]
        if v is not None and (not _number(v) or not 0 <= v <= 365 * 86400):
            problems.append("auto_promote_after_s must be null or a number of seconds from 0 to 31536000")
        else:
            out["auto_promote_after_s"] = float(v) if v is not None else None
    if problems:
        raise InvalidRequest(
            f"invalid canary_policy: {'; '.join(problems)}",
            details={"field": "canary_policy", "problems": problems},
        )
    return out
