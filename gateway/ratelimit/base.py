"""Rate-limit model shared by the in-memory and the Redis limiter (SPEC §7).

Scheme: a **token bucket per limit** (continuous refill). A limit of ``L`` per minute is a
bucket of capacity ``L`` refilled at ``L/60`` per second; a request takes ``cost`` from it
(1 for rpm, the estimated tokens for tpm). ``remaining`` is the whole tokens left,
``reset`` the time until the bucket is full again (what OpenAI's ``x-ratelimit-reset-*``
means), and a rejection's ``Retry-After`` the time until the bucket holds ``cost``.
Concurrency is a count of open slots (in Redis a sorted set of leases, each scored by its
expiry: the process holding it renews it every ``lease_s / 3``, so a slot of a live request is
kept however long the request runs, and a slot of a process that died frees within ``lease_s``).

Levels (SPEC §7, §15): ``tenant`` (rpm, tpm, concurrency), ``grant`` (the tenant on one adapter:
rpm, tpm), ``adapter`` (shared by every tenant: rpm, tpm, concurrency) and ``owner`` (every
adapter of one owner: rpm, tpm, concurrency). One admission checks every applicable limit of
every level and only then commits all of them: a rejection consumes nothing. At the end of the answer,
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
Scope = Literal["tenant", "grant", "adapter", "owner"]


class LevelLimits(Protocol):
    """rpm / tpm / max_concurrency of one level (``registry.snapshot.Limits`` has this shape)."""

    @property
    def rpm(self) -> int | None: ...
    @property
    def tpm(self) -> int | None: ...
    @property
    def max_concurrency(self) -> int | None: ...


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
class Slot:
    """A concurrency limit: at most ``limit`` leases open under ``key`` at once."""

    key: str  # store key, without the global prefix
    scope: Scope
    limit: int


@dataclass(frozen=True, slots=True)
class AdmissionPlan:
    buckets: tuple[Bucket, ...] = ()
    slots: tuple[Slot, ...] = ()
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
    slot_keys: tuple[str, ...]  # concurrency keys holding this lease
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

    def details(self) -> dict[str, object]:
        """The 429's ``details``: which level and which limit was hit, and when to retry."""
        return {
            "level": self.rejected_scope,
            "limit": "max_concurrency" if self.rejected_kind == "concurrency" else self.rejected_kind,
            "value": self.rejected_limit,
            "retry_after_s": round(self.retry_after_s, 3),
        }


class Limiter(Protocol):
    name: str

    async def admit(self, plan: AdmissionPlan) -> AdmitResult:
        """Check every limit of ``plan``; commit all or nothing. Raises LimiterUnavailable."""
        ...

    async def peek(self, plan: AdmissionPlan) -> list[BucketState]:
        """Current state of the plan's buckets, consuming nothing (for headers of non-admitted answers)."""
        ...

    async def settle(self, lease: Lease, actual_tokens: int | None) -> None:
        """Correct tpm by the real usage (None: keep the estimate) and release the slot; returns once
        the store has done it, so whatever the client does next (at any gateway) sees it. Idempotent.
        A settlement whose caller is cancelled still goes to the store."""
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
    adapter_limits: LevelLimits | None = None,
    owner: str | None = None,
    owner_limits: LevelLimits | None = None,
) -> AdmissionPlan:
    """The limits that apply to one request (None = unlimited, left out).

    ``adapter_limits`` apply with ``adapter_id``; ``owner_limits`` with ``owner`` (the adapter's).
    """
    buckets: list[Bucket] = []
    slots: list[Slot] = []

    def level(prefix: str, scope: Scope, r: int | None, t: int | None, c: int | None) -> None:
        if r is not None:
            buckets.append(Bucket(f"{prefix}:rpm", "rpm", scope, r, 1))
        if t is not None:
            buckets.append(Bucket(f"{prefix}:tpm", "tpm", scope, t, estimated_tokens))
        if c is not None:
            slots.append(Slot(f"{prefix}:conc", scope, c))

    level(f"t:{tenant_id}", "tenant", rpm, tpm, max_concurrency)
    if adapter_id is not None:
        level(f"g:{tenant_id}:{adapter_id}", "grant", grant_rpm, grant_tpm, None)
        if adapter_limits is not None:
            a = adapter_limits
            level(f"a:{adapter_id}", "adapter", a.rpm, a.tpm, a.max_concurrency)
    if owner is not None and owner_limits is not None:
        o = owner_limits
        level(f"o:{owner}", "owner", o.rpm, o.tpm, o.max_concurrency)
    return AdmissionPlan(buckets=tuple(buckets), slots=tuple(slots), estimated_tokens=estimated_tokens)


def lease_for(plan: AdmissionPlan, lease_id: str | None = None) -> Lease:
    lease = Lease(
        token_buckets=tuple(b for b in plan.buckets if b.kind == "tpm"),
        estimated_tokens=plan.estimated_tokens,
        slot_keys=tuple(s.key for s in plan.slots),
    )
    if lease_id is not None:
        lease.lease_id = lease_id
    return lease


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


_WHO: dict[str, str] = {
    "tenant": "the tenant",
    "grant": "the tenant for this adapter (grant)",
    "adapter": "the adapter, shared by all tenants",
    "owner": "the adapter's owner, shared by all of its adapters",
}


def rejection_message(result: AdmitResult) -> str:
    kind, limit = result.rejected_kind, result.rejected_limit
    who = _WHO.get(result.rejected_scope or "tenant", "the tenant")
    if kind == "rpm":
        what = f"requests per minute limit of {who} ({limit} rpm)"
    elif kind == "tpm":
        what = f"tokens per minute limit of {who} ({limit} tpm)"
    else:
        what = f"concurrent requests limit of {who} ({limit})"
    return f"Rate limit exceeded: {what}. Retry after {retry_after(result)}s."


def retry_after(result: AdmitResult) -> int:
    """Whole seconds for ``Retry-After`` (at least 1)."""
    return max(1, math.ceil(result.retry_after_s))
