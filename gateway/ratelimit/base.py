"""Rate-limit model shared by the in-memory and the Redis limiter (SPEC §7).

Scheme: a **token bucket per limit** (continuous refill). A limit of ``L`` per minute is a
bucket of capacity ``L`` refilled at ``L/60`` per second; a request takes ``cost`` from it
(1 for rpm, the estimated tokens for tpm). ``remaining`` is the whole tokens left,
``reset`` the time until the bucket is full again (what OpenAI's ``x-ratelimit-reset-*``
means), and a rejection's ``Retry-After`` the time until the bucket holds ``cost``.
Concurrency is a count of open slots (in Redis a sorted set of leases with a safety expiry).

One admission checks every applicable limit (tenant rpm/tpm/concurrency, grant rpm/tpm) and
only then commits all of them: a rejection consumes nothing. At the end of the answer,
:meth:`Limiter.settle` corrects the tpm buckets by ``actual - estimated`` tokens (a refund is
capped at the capacity; an overrun may drive a bucket below zero, down to ``-capacity``) and
releases the concurrency slot. Settling is idempotent.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal, Protocol

from kit.ids import new_id

Kind = Literal["rpm", "tpm", "concurrency"]
Scope = Literal["tenant", "grant"]


class LimiterUnavailable(Exception):
    """The shared rate-limit store could not be reached (the gateway applies ratelimit_on_error)."""


@dataclass(frozen=True, slots=True)
class Bucket:
    key: str  # store key, without the global prefix
    kind: Literal["rpm", "tpm"]
    scope: Scope
    limit: int  # per minute
    cost: int


@dataclass(frozen=True, slots=True)
class AdmissionPlan:
    buckets: tuple[Bucket, ...] = ()
    concurrency_key: str | None = None
    concurrency_limit: int | None = None
    estimated_tokens: int = 0


@dataclass(frozen=True, slots=True)
class BucketState:
    bucket: Bucket
    remaining: int
    reset_s: float


@dataclass(slots=True)
class Lease:
    """What settle() needs to correct token buckets and free the concurrency slot."""

    token_buckets: tuple[Bucket, ...]
    estimated_tokens: int
    concurrency_key: str | None
    lease_id: str = field(default_factory=new_id)
    settled: bool = False


@dataclass(slots=True)
class AdmitResult:
    admitted: bool
    states: list[BucketState]
    rejected_kind: Kind | None = None
    rejected_scope: Scope | None = None
    rejected_limit: int | None = None
    retry_after_s: float = 0.0
    lease: Lease | None = None


class Limiter(Protocol):
    name: str

    async def admit(self, plan: AdmissionPlan) -> AdmitResult:
        """Check every limit of ``plan``; commit all or nothing. Raises LimiterUnavailable."""
        ...

    async def peek(self, plan: AdmissionPlan) -> list[BucketState]:
        """Current state of the plan's buckets, consuming nothing (for headers of non-admitted answers)."""
        ...

    async def settle(self, lease: Lease, actual_tokens: int | None) -> None:
        """Correct tpm by the real usage (None: keep the estimate) and release the slot. Idempotent."""
        ...

    async def healthy(self) -> bool: ...

    async def close(self) -> None: ...


def make_plan(
    *,
    tenant_id: str,
    rpm: int | None,
    tpm: int | None,
    max_concurrency: int | None,
    estimated_tokens: int,
    adapter_id: str | None = None,
    grant_rpm: int | None = None,
    grant_tpm: int | None = None,
) -> AdmissionPlan:
    """The limits that apply to one request (None = unlimited, left out)."""
    buckets: list[Bucket] = []
    if rpm is not None:
        buckets.append(Bucket(f"t:{tenant_id}:rpm", "rpm", "tenant", rpm, 1))
    if tpm is not None:
        buckets.append(Bucket(f"t:{tenant_id}:tpm", "tpm", "tenant", tpm, estimated_tokens))
    if adapter_id is not None:
        if grant_rpm is not None:
            buckets.append(Bucket(f"g:{tenant_id}:{adapter_id}:rpm", "rpm", "grant", grant_rpm, 1))
        if grant_tpm is not None:
            buckets.append(
                Bucket(f"g:{tenant_id}:{adapter_id}:tpm", "tpm", "grant", grant_tpm, estimated_tokens)
            )
    return AdmissionPlan(
        buckets=tuple(buckets),
        concurrency_key=f"t:{tenant_id}:conc" if max_concurrency is not None else None,
        concurrency_limit=max_concurrency,
        estimated_tokens=estimated_tokens,
    )


def lease_for(plan: AdmissionPlan) -> Lease:
    return Lease(
        token_buckets=tuple(b for b in plan.buckets if b.kind == "tpm"),
        estimated_tokens=plan.estimated_tokens,
        concurrency_key=plan.concurrency_key,
    )


def format_reset(seconds: float) -> str:
    """OpenAI's reset format: ``"20ms"``, ``"1s"``, ``"1.5s"``, ``"6m0s"``."""
    if seconds <= 0:
        return "0s"
    if seconds < 1:
        return f"{max(1, math.ceil(seconds * 1000))}ms"
    if seconds < 60:
        s = math.ceil(seconds * 10) / 10
        return f"{s:g}s"
    total = math.ceil(seconds)
    return f"{total // 60}m{total % 60}s"


def rate_limit_headers(states: list[BucketState]) -> list[tuple[bytes, bytes]]:
    """``x-ratelimit-{limit,remaining,reset}-{requests,tokens}`` from the tightest bucket of each kind.

    A kind with no (limited) bucket is left out, as SPEC §13 says for unlimited limits.
    """
    out: list[tuple[bytes, bytes]] = []
    for kind, word in (("rpm", b"requests"), ("tpm", b"tokens")):
        tight: BucketState | None = None
        for s in states:
            if s.bucket.kind == kind and (tight is None or s.remaining < tight.remaining):
                tight = s
        if tight is None:
            continue
        out.append((b"x-ratelimit-limit-" + word, str(tight.bucket.limit).encode()))
        out.append((b"x-ratelimit-remaining-" + word, str(max(0, tight.remaining)).encode()))
        out.append((b"x-ratelimit-reset-" + word, format_reset(tight.reset_s).encode()))
    return out


def rejection_message(result: AdmitResult) -> str:
    kind, scope, limit = result.rejected_kind, result.rejected_scope, result.rejected_limit
    who = "tenant" if scope == "tenant" else "tenant for this adapter (grant)"
    if kind == "rpm":
        what = f"requests per minute limit of the {who} ({limit} rpm)"
    elif kind == "tpm":
        what = f"tokens per minute limit of the {who} ({limit} tpm)"
    else:
        what = f"concurrent requests limit of the tenant ({limit})"
    return f"Rate limit exceeded: {what}. Retry after {max(1, math.ceil(result.retry_after_s))}s."
