"""CONTRACT of the placement layer: a pure function of a snapshot (DESIGN.md examples 8, 17).

The router runtime builds ``ReplicaView``s from its replica store (health, scraped metrics,
its residency facts with cluster-wide in-flight counts) and calls a ``Profile``::

    decision = profile.pick(PlacementRequest(...), replicas, now)

Nothing here does I/O; benchmarks replay traces through the same code.

``Residency`` is the one name of a residency fact — one adapter version on one replica — in
the whole router: the replica store keeps them (``router.replica``), the cluster state shares
them (``router.cluster``) and placement reads them here. Facts are immutable: a change is a new
fact (``dataclasses.replace``).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

ResidencyState = Literal["staging", "loading", "resident", "unloading", "failed"]
# Where a request's adapter would come from on a replica (cheapest first): ``gpu`` running or
# in a GPU slot, ``cpu`` registered and in the engine's host-memory cache (``max_cpu_loras``),
# ``disk`` registered but re-read from disk inside the engine, ``load`` not registered there:
# loraplane stages and loads it. ``""``: a base-model request.
Tier = Literal["gpu", "cpu", "disk", "load", ""]


@dataclass(frozen=True, slots=True)
class Residency:
    """One adapter version on one replica, as this process knows it (or the cluster shares it)."""

    lora_name: str
    state: ResidencyState
    adapter_id: str = ""
    version: str = ""
    since: float = 0.0  # clock seconds when the state was entered (this process's clock)
    last_used: float = 0.0  # clock seconds of the last request routed to it there
    # In a placement view: requests in flight for it there, every gateway process together.
    # In the store: always 0 (its counts live beside the facts: ``ReplicaState.inflight_of``).
    inflight: int = 0
    # Requests routed to this adapter so far, all replicas together (kept across evictions;
    # the cost-aware evictor weighs it by recency); 0 = unknown, counted as 1.
    requests: int = 0
    size_bytes: int = 0
    rank: int = 0  # LoRA rank (0: unknown)
    # Shared through the cluster state: the process that wrote it, when (wall seconds), and for
    # ``failed`` why, whether another replica may succeed, and the message.
    pid: str = ""
    ts: float = 0.0
    failure: str = ""
    retry_elsewhere: bool = True
    reason: str = ""


@dataclass(frozen=True, slots=True)
class ReplicaView:
    url: str
    pool: str
    healthy: bool
    max_loras: int  # GPU slots: distinct adapters that can run in one batch
    max_adapters: int  # adapters kept registered (loaded) on the replica
    residents: dict[str, Residency] = field(default_factory=dict)  # lora_name → Residency
    inflight: int = 0  # router's own count of requests in flight on this replica
    running: int = 0  # vllm:num_requests_running (scraped)
    waiting: int = 0  # vllm:num_requests_waiting (scraped)
    kv_cache_usage: float = 0.0  # vllm:kv_cache_usage_perc (0..1)
    # From vllm:lora_requests_info (latest sample); only the GIE-style baseline reads these.
    lora_running: tuple[str, ...] = ()
    lora_waiting: tuple[str, ...] = ()
    # Capacity of the replica (from its pool's configuration or the replica itself, issue 24.11):
    max_num_seqs: int = 256  # vLLM --max-num-seqs: requests running at once
    max_cpu_loras: int = 0  # vLLM --max-cpu-loras: adapters cached in host memory (0: = max_loras)
    max_lora_rank: int = 0  # vLLM --max-lora-rank: GPU slots are padded to it (0: unknown)
    reserved_hot_slots: int = 0  # of max_loras, slots kept for hot adapters (SPEC §15)
    # Per-snapshot memo of values derived from ``residents`` (occupancy, running set, LRU idle
    # order, tiers), filled lazily by ``router.placement``. Views are snapshots: build a new view
    # instead of mutating ``residents`` after a pick.
    derived: dict[str, Any] = field(default_factory=dict, init=False, compare=False, repr=False)

    def running_adapters(self) -> int:
        """Distinct adapters with requests in flight on this replica (router's own count)."""
        return sum(1 for r in self.residents.values() if r.inflight > 0)

    @property
    def cpu_loras(self) -> int:
        """Adapters the engine keeps in host memory (vLLM's default: ``max_loras``)."""
        return max(self.max_cpu_loras, self.max_loras)


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
    # exists. ``strict_hot`` (a prewarm, or a load of the placement plan): rather than take such
    # a copy (or a planned one), make no room at all (the evictor answers None).
    hot_targets: Mapping[str, int] = field(default_factory=dict)
    strict_hot: bool = False
    # The placement plan (``router.placement.plan``): lora_name → the replicas that should hold
    # it. The default policy prefers the requested adapter's targets; every evictor passes over
    # an idle adapter planned on its replica while another victim exists.
    plan: Mapping[str, frozenset[str]] = field(default_factory=dict)
    # Prompt tokens of this request already in each replica's prefix cache for this adapter
    # (replica url → tokens), from the router's prefix index (``router.prefix``).
    prefix: Mapping[str, int] = field(default_factory=dict)
    rank: int = 0  # the adapter's LoRA rank (0: unknown)


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
    tier: Tier = ""  # where the adapter comes from on ``replica`` (metrics: loads per tier)


class Profile(Protocol):
    name: str

    def pick(self, request: PlacementRequest, replicas: list[ReplicaView], now: float) -> Decision: ...
