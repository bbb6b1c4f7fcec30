"""What several gateway processes must agree on about the replicas (SPEC §17), as one interface.

Per replica the cluster keeps **residency facts** (``Residency``: lora_name → state, the process
that wrote it, when) and **in-flight marks** (which processes have requests in flight for an adapter
there, or are waiting for its load). Every process keeps its own copy of both for placement
(refreshed every ``cluster_sync_s``: bounded staleness, no round trip per decision); the
operations below are the atomic checks that make the copies safe to act on:

- ``mark`` before a request uses (or waits for) an adapter on a replica: refused while the
  adapter is being unloaded there. ``unmark`` when it is done (the mark lingers briefly, so
  back-to-back requests don't write each time).
- ``claim`` before a load: ``present`` (someone has it or is loading it), ``reserved`` (this
  process now owns the load; ``evict`` lists the residents it must unload first, already
  marked ``unloading`` for it), ``full`` (no room: every resident is busy), ``failed``
  (another process's load failed since ``since``) or ``busy`` (the replica or its pool already
  has its ``LoadCaps`` of loads in flight: wait and claim again). The record count of a replica — loading,
  resident and unloading together — never exceeds ``max_adapters``.
- ``set_state(…, "loading", settling=True)``: the load call went unanswered and the replica may
  still finish it (issue 24.9): the record keeps counting toward ``max_adapters`` but no longer
  toward the ``LoadCaps`` of loads in flight.
- ``begin_unload`` refuses while any live process has a mark on the adapter there.
- Processes hold a liveness lease renewed every ``lease_s``/3; records and marks of a process
  whose lease expired are ignored and cleared, so a crashed gateway never pins an adapter.
- ``lead(name)``: one process at a time runs cluster-wide chores (hot prewarm, unloads of
  disabled versions), under a renewed lease.

``MemoryCluster`` is the in-process implementation (one gateway: ``loraplane up``);
``RedisCluster`` shares the same state through Redis (Lua for every read-modify-write) and
falls back to in-process behaviour while Redis is unreachable.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol

from router.placement.types import Residency, ResidencyState

ClaimOutcome = Literal["present", "reserved", "full", "failed", "busy"]
# States that occupy a slot of ``max_adapters`` (``failed`` does not).
OCCUPYING: frozenset[str] = frozenset({"staging", "loading", "resident", "unloading"})


@dataclass(frozen=True, slots=True)
class Claim:
    outcome: ClaimOutcome
    record: Residency | None = None  # present / failed: the record found
    evict: tuple[str, ...] = ()  # reserved: unload these first (marked unloading for us)
    busy: str = ""  # busy: the cap reached (``replica`` | ``pool``), or ``turn`` (another process's)


@dataclass(frozen=True, slots=True)
class LoadCaps:
    """Cold-load admission (SPEC §15): loads in flight per replica and per pool (0 = no cap)."""

    per_replica: int = 0
    per_pool: int = 0
    pool: str = ""
    # Turns across processes at a replica's cap (0 = off): a process that waits for one of the
    # replica's load slots is registered for this long (renewed by each try); while another
    # process waits there, the process that claimed the replica's last slot yields the next one
    # (``busy`` = ``turn``). Each process orders its own waiters (``router.fairness``); the turns
    # keep one process's queue from taking every slot its own loads free.
    turn_ttl_s: float = 0.0
    # Work no request waits for (a prewarm, the placement plan's loads): with turns on, it takes a
    # replica's slot only while no other process waits there, and never registers as waiting.
    background: bool = False


@dataclass(frozen=True, slots=True)
class ReplicaShare:
    """The cluster's view of one replica: records, and live marks of *other* processes."""

    records: dict[str, Residency] = field(default_factory=dict)
    remote_marks: dict[str, int] = field(default_factory=dict)  # lora_name → other live processes


class ClusterState(Protocol):
    """See the module docstring. Every method is safe to call concurrently."""

    pid: str

    @property
    def shared(self) -> bool:
        """True while the state is shared with other processes (Redis reachable)."""
        ...

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    async def mark(self, url: str, lora_name: str) -> bool: ...

    def unmark(self, url: str, lora_name: str) -> None: ...

    async def claim(
        self,
        url: str,
        lora_name: str,
        max_adapters: int,
        candidates: Sequence[str],
        since: float,
        caps: LoadCaps = ...,
    ) -> Claim: ...

    async def set_state(
        self,
        url: str,
        lora_name: str,
        state: ResidencyState,
        *,
        failure: str = "",
        retry_elsewhere: bool = True,
        reason: str = "",
        settling: bool = False,
    ) -> None: ...

    async def drop(self, url: str, lora_name: str) -> None: ...

    async def record(self, url: str, lora_name: str) -> Residency | None: ...

    async def begin_unload(self, url: str, lora_name: str) -> bool: ...

    async def end_unload(self, url: str, lora_name: str, ok: bool) -> None: ...

    async def sync_models(self, url: str, listed: Iterable[str], asked_at: float) -> None: ...

    async def read(self, urls: Sequence[str]) -> dict[str, ReplicaShare] | None: ...

    async def lead(self, name: str) -> bool: ...
