"""CONTRACT of the placement layer: a pure function of a snapshot (DESIGN.md example 8).

The router runtime builds ``ReplicaView``s from its replica store (health, scraped metrics,
its own residency records and in-flight counts) and calls a ``Profile``::

    decision = profile.pick(PlacementRequest(...), replicas, now)

Nothing here does I/O; benchmarks replay traces through the same code.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

ResidencyState = Literal["staging", "loading", "resident", "unloading", "failed"]


@dataclass(frozen=True, slots=True)
class Resident:
    """One adapter version the router knows to be on a replica."""

    lora_name: str
    adapter_id: str
    state: ResidencyState
    last_used: float  # clock seconds of the last request routed to it there
    inflight: int = 0  # requests the router has in flight for it on this replica
    size_bytes: int = 0
    # ADDED (placement, issue 9): requests routed to this adapter since the router started, all
    # replicas together (one counter per lora_name, kept across evictions and reloads; the
    # runtime copies it into every Resident of that adapter). The cost-aware evictor weighs it
    # by recency (``last_used``); 0 = unknown, counted as 1.
    requests: int = 0


@dataclass(frozen=True, slots=True)
class ReplicaView:
    url: str
    pool: str
    healthy: bool
    max_loras: int  # GPU slots: distinct adapters that can run in one batch
    max_adapters: int  # adapters kept registered (loaded) on the replica
    residents: dict[str, Resident] = field(default_factory=dict)  # lora_name → Resident
    inflight: int = 0  # router's own count of requests in flight on this replica
    running: int = 0  # vllm:num_requests_running (scraped)
    waiting: int = 0  # vllm:num_requests_waiting (scraped)
    kv_cache_usage: float = 0.0  # vllm:kv_cache_usage_perc (0..1)
    # From vllm:lora_requests_info (latest sample); only the GIE-style baseline reads these.
    lora_running: tuple[str, ...] = ()
    lora_waiting: tuple[str, ...] = ()
    max_num_seqs: int = 256
    # ADDED (placement): per-snapshot memo of values derived from ``residents`` (occupancy, running
    # set, LRU idle order), filled lazily by ``router.placement`` so a decision stays O(replicas).
    # Views are snapshots: build a new view instead of mutating ``residents`` after a pick.
    derived: dict[str, Any] = field(default_factory=dict, init=False, compare=False, repr=False)

    def running_adapters(self) -> int:
        """Distinct adapters with requests in flight on this replica (router's own count)."""
        return sum(1 for r in self.residents.values() if r.inflight > 0)


@dataclass(frozen=True, slots=True)
class PlacementRequest:
    lora_name: str | None  # None → base model request (no adapter)
    adapter_id: str | None
    size_bytes: int = 0  # adapter weights size (load cost)
    prompt_tokens: int = 0
    max_tokens: int = 0
    exclude: frozenset[str] = frozenset()  # replica urls to avoid (failover retry)
    # lora_name → copies the cluster keeps warm (hot adapters, SPEC §8/§17): an evictor never
    # takes a copy whose eviction would leave fewer than that many while another idle victim
    # exists. ``strict_hot`` (a hot prewarm): rather than take such a copy, make no room at all
    # (the evictor answers None), so hot adapters never evict each other.
    hot_targets: Mapping[str, int] = field(default_factory=dict)
    strict_hot: bool = False


Action = Literal["hit", "load", "replicate", "none"]


class Scores(Mapping[str, float]):
    """url → final score of every candidate, built into a dict only when read (decisions are
    made far more often than their scores are looked at: debugging, logs, tests)."""

    __slots__ = ("_d", "_totals", "_urls")

    def __init__(self, urls: Sequence[str] = (), totals: Sequence[float] = ()) -> None:
        self._urls = urls
        self._totals = totals
        self._d: dict[str, float] | None = None

    def _dict(self) -> dict[str, float]:
        d = self._d
        if d is None:
            d = self._d = dict(zip(self._urls, self._totals, strict=True))
        return d

    def __getitem__(self, url: str) -> float:
        return self._dict()[url]

    def __iter__(self) -> Iterator[str]:
        return iter(self._dict())

    def __len__(self) -> int:
        return len(self._urls)

    def __repr__(self) -> str:
        return repr(self._dict())


@dataclass(frozen=True, slots=True)
class Decision:
    replica: str | None  # chosen replica url; None → no capacity
    action: Action  # hit: already resident; load: first copy; replicate: another copy of a resident one
    evict: tuple[str, ...] = ()  # lora_names to unload from ``replica`` first (it is at max_adapters)
    scores: Mapping[str, float] = field(default_factory=Scores)  # url → final score (debugging/metrics)
    reason: str = ""


class Profile(Protocol):
    name: str

    def pick(self, request: PlacementRequest, replicas: list[ReplicaView], now: float) -> Decision: ...
