"""Tenant rate limits (SPEC §7): token buckets for rpm/tpm, slots for concurrency.

``MemoryLimiter`` (embedded default) and ``RedisLimiter`` (one Lua script per admission,
atomic across gateway processes) share the semantics described in :mod:`gateway.ratelimit.base`.
"""

from gateway.ratelimit.base import (
    AdmissionPlan,
    AdmitResult,
    Bucket,
    BucketState,
    Lease,
    Limiter,
    LimiterUnavailable,
    format_reset,
    make_plan,
    rate_limit_headers,
    rejection_message,
)
from gateway.ratelimit.memory import MemoryLimiter
from gateway.ratelimit.redis_limiter import RedisLimiter

__all__ = [
    "AdmissionPlan",
    "AdmitResult",
    "Bucket",
    "BucketState",
    "Lease",
    "Limiter",
    "LimiterUnavailable",
    "MemoryLimiter",
    "RedisLimiter",
    "format_reset",
    "make_plan",
    "rate_limit_headers",
    "rejection_message",
]
