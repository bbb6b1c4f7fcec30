"""Per-version outcome counters of canary analysis: what the gateways record, what the analyser
reads (SPEC §16).

Each version's counters are cumulative since the gateway process (memory) or the Redis hash
(cluster) started counting; the analyser takes a baseline when it starts a window and works on
the difference. Redis layout, one hash per version that the gateways' traffic touched while its
adapter had a canary::

    {prefix}canary:{adapter_id}:{version}   n → answers counted, err → errors among them,
                                            t{bucket} → answers per TTFT bucket (sketch)

    {prefix}canary:{adapter_id}:{version}:answers   list of sampled answer texts (the newest
                                                    :data:`ANSWERS_KEPT`), taken by the analyser

Every gateway adds its batch with ``HINCRBY`` / ``RPUSH`` in one ``MULTI``/``EXEC`` pipeline
(never a round trip per request) and refreshes the keys' expiry (:data:`KEY_TTL_S`); the analyser
reads both arms with one ``HGETALL`` each per tick, and takes the sampled answers.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

KEY_TTL_S = 7 * 86400  # a version nobody has sent traffic to for a week loses its counters
ANSWERS_KEPT = 1000  # sampled answers waiting for the analyser, per version (the newest)


@dataclass(slots=True)
class ArmCounts:
    """One arm's outcomes: answers counted, errors among them, TTFT buckets."""

    requests: int = 0
    errors: int = 0
    ttft: Counter[int] = field(default_factory=Counter)

    def add(self, other: ArmCounts) -> None:
        self.requests += other.requests
        self.errors += other.errors
        self.ttft.update(other.ttft)

    def minus(self, base: ArmCounts) -> ArmCounts:
        """The counts since ``base`` was taken (a counter that went backwards — a Redis hash that
        expired, a restarted process — counts from zero)."""
        if self.requests < base.requests or self.errors < base.errors:
            return self.copy()
        ttft: Counter[int] = Counter()
        for b, c in self.ttft.items():
            d = c - base.ttft.get(b, 0)
            if d > 0:
                ttft[b] = d
        return ArmCounts(self.requests - base.requests, self.errors - base.errors, ttft)

    def copy(self) -> ArmCounts:
        return ArmCounts(self.requests, self.errors, Counter(self.ttft))

    @property
    def error_rate(self) -> float | None:
        return self.errors / self.requests if self.requests else None

    def to_fields(self) -> dict[str, int]:
        """The Redis hash fields of these counts (to add with ``HINCRBY``)."""
        out = {"n": self.requests, "err": self.errors}
        for b, c in self.ttft.items():
            out[f"t{b}"] = c
        return {k: v for k, v in out.items() if v}

    @classmethod
    def of_fields(cls, fields: Mapping[Any, Any]) -> ArmCounts:
        """From a Redis hash (bytes or str keys and values); unknown fields are ignored."""
        out = cls()
        for k, v in fields.items():
            key = k.decode() if isinstance(k, bytes) else str(k)
            try:
                n = int(v)
            except (TypeError, ValueError):
                continue
            if key == "n":
                out.requests = n
            elif key == "err":
                out.errors = n
            elif key.startswith("t") and key[1:].isdigit():
                out.ttft[int(key[1:])] = n
        return out


class CounterSource(Protocol):
    """Where the analyser reads the cumulative counts of one version."""

    async def read(self, adapter_id: str, version: str) -> ArmCounts: ...

    async def take_answers(self, adapter_id: str, version: str, limit: int) -> list[str]:
        """Up to ``limit`` sampled answer texts of the version, oldest first, removed."""
        ...


def counter_key(prefix: str, adapter_id: str, version: str) -> str:
    return f"{prefix}canary:{adapter_id}:{version}"


def answers_key(prefix: str, adapter_id: str, version: str) -> str:
    return f"{prefix}canary:{adapter_id}:{version}:answers"


class RedisCounterSource:
    """Reads the counters every gateway of the cluster adds to (one ``HGETALL`` per version)."""

    def __init__(self, redis: Any, prefix: str) -> None:
        self.redis = redis
        self.prefix = prefix

    async def read(self, adapter_id: str, version: str) -> ArmCounts:
        return ArmCounts.of_fields(await self.redis.hgetall(counter_key(self.prefix, adapter_id, version)))

    async def take_answers(self, adapter_id: str, version: str, limit: int) -> list[str]:
        key = answers_key(self.prefix, adapter_id, version)
        pipe = self.redis.pipeline(transaction=True)
        pipe.lrange(key, 0, limit - 1)
        pipe.ltrim(key, limit, -1)
        got, _ = await pipe.execute()
        return [t.decode("utf-8", "replace") if isinstance(t, bytes) else str(t) for t in got]
