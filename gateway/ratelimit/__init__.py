"""Rate limits (SPEC §7, §15) per tenant, grant, adapter and owner: token buckets for rpm/tpm,
slots with leases for concurrency.

``MemoryLimiter`` (embedded default) and ``RedisLimiter`` (one Lua script per admission,
atomic across gateway processes) share the semantics described in :mod:`gateway.ratelimit.base`.
"""

from gateway.ratelimit.base import (
    AdmissionPlan,
    AdmitResult,
    Bucket,
    BucketState,
    Lease,
    LevelLimits,
    Limiter,
    LimiterUnavailable,
    Slot,
    format_reset,
    make_plan,
    rate_limit_headers,
    rejection_message,
    retry_after,
)
from gateway.ratelimit.memory import MemoryLimiter
from gateway.ratelimit.redis_limiter import RedisLimiter

__all__ = [
    "AdmissionPlan",
    "AdmitResult",
    "Bucket",
    "BucketState",
    "Lease",
    "LevelLimits",
    "Limiter",
    "LimiterUnavailable",
    "MemoryLimiter",
    "RedisLimiter",
    "Slot",
    "format_reset",
    "make_plan",
    "rate_limit_headers",
    "rejection_message",
    "retry_after",
]
