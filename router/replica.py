"""One replica's mutable state in this process, and its residency facts.

``ReplicaState.residents`` maps lora_name → ``Residency`` (``router.placement.types``): the
router's one name for "this adapter version is on that replica, in this state". Facts are
immutable; a change puts a new fact (``residents.change(name, state=...)``). What changes with
every request is kept beside them: this process's in-flight count per adapter (``start`` /
``finish``), the other gateway processes' marks (``remote``), and the requests routed to each
adapter (``asked``, shared by every replica of the store, kept across evictions).

``view()`` is the placement snapshot (cached until something it is built from changes: a fact,
a count, health, metrics); each change also reports the replica's url to ``feed`` (the store's
``changes``), so the planner's tables re-index only the replicas that changed.
"""

from __future__ import annotations

import asyncio
import re
from dataclasses import dataclass, field, replace
from typing import Any
from urllib.parse import urlsplit

from router.drivers import EngineDriver, MetricsSample
from router.placement.types import ReplicaView, Residency
from router.settings import PoolConfig

LORA_NAME_RE = re.compile(
    r"^(?P<adapter>[a-z0-9][a-z0-9._-]{0,62})@(?P<version>v[1-9][0-9]{0,8})-(?P<sha>[0-9a-f]{8})$"
)


def parse_lora_name(name: str) -> tuple[str, str] | None:
    """``"acme@v3-1a2b3c4d"`` → ``("acme", "v3")``; None when the name is not one of ours."""
    m = LORA_NAME_RE.match(name)
    if not m or ".." in m.group("adapter"):
        return None
    return m.group("adapter"), m.group("version")


class Residents(dict[str, Residency]):
    """A replica's residency facts; every change drops the replica's cached view."""

    __slots__ = ("_owner",)

    def __init__(self, owner: ReplicaState) -> None:
        super().__init__()
        self._owner = owner

    def __setitem__(self, name: str, r: Residency) -> None:
        super().__setitem__(name, r)
        self._owner.changed(name)

    def __delitem__(self, name: str) -> None:
        super().__delitem__(name)
        self._owner.changed(name)

    def pop(self, name: str, *default: Any) -> Any:  # type: ignore[override]
        out = super().pop(name, *default)
        self._owner.changed(name)
        return out

    def clear(self) -> None:
        super().clear()
        self._owner.changed(None)

    def change(self, name: str, **changes: Any) -> Residency | None:
        """Replace the fact of ``name`` with ``changes`` applied (None when there is none)."""
        r = self.get(name)
        if r is None:
            return None
        r = self[name] = replace(r, **changes)
        return r


# ReplicaState fields a ReplicaView is built from: setting one drops the cached view.
_VIEW_FIELDS = frozenset({"healthy", "metrics", "inflight", "pool", "url"})


@dataclass(slots=True)
class ReplicaState:
    """Mutable state of one replica; only the store and the router runtime change it."""

    # Declared first: assigned before the fields below, whose assignment reports to it.
    feed: set[str] | None = field(default=None, init=False, repr=False, compare=False)
    seq: int = field(default=0, init=False, compare=False)  # the store's order of replicas
    url: str
    pool: PoolConfig
    driver: EngineDriver
    healthy: bool = False
    failures: int = 0
    last_seen: float | None = None  # clock time of the last good poll
    last_seen_wall: float | None = None
    metrics: MetricsSample = field(default_factory=MetricsSample)
    base_names: tuple[str, ...] = ()
    residents: Residents = field(init=False)
    inflight: int = 0  # this process's requests in flight on the replica
    local: dict[str, int] = field(default_factory=dict)  # lora_name → this process's in flight
    remote: dict[str, int] = field(default_factory=dict)  # lora_name → other live processes' marks
    asked: dict[str, int] = field(default_factory=dict)  # lora_name → requests routed (store-wide)
    poll_started_wall: float = 0.0  # wall time the last completed poll asked its questions
    polled: asyncio.Event = field(default_factory=asyncio.Event)
    # passive outlier detection: consecutive failed requests/loads; out of rotation until then
    consecutive_failures: int = 0
    failed_models: set[str] = field(default_factory=set)  # what those failures were for ("*": the replica)
    ejected_until: float = 0.0
    # failed loads in a row (requests served there in between do not reset it) and of what; no
    # new adapter is placed there until loads_paused_until (``Outliers.note_load``)
    load_failures: int = 0
    load_failed_models: set[str] = field(default_factory=set)
    loads_paused_until: float = 0.0
    # requests sent here still waiting for their first byte (aborted when the replica is ejected)
    pending: set[asyncio.Task[Any]] = field(default_factory=set)
    aborted: set[asyncio.Task[Any]] = field(default_factory=set)
    _view: ReplicaView | None = field(default=None, init=False, repr=False, compare=False)
    _snaps: dict[str, Residency] = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "residents", Residents(self))

    def __setattr__(self, name: str, value: Any) -> None:
        object.__setattr__(self, name, value)
        if name in _VIEW_FIELDS:
            self.drop_view()

    def drop_view(self) -> None:
        """Forget the cached view (something it is built from changed) and report the change."""
        object.__setattr__(self, "_view", None)
        feed = self.feed
        if feed is not None:
            feed.add(self.url)

    def changed(self, name: str | None) -> None:
        """The fact or a count of ``name`` (None: of every adapter) changed."""
        if name is None:
            self._snaps.clear()
        else:
            self._snaps.pop(name, None)
        self.drop_view()

    @property
    def host(self) -> str:
        return urlsplit(self.url).hostname or "127.0.0.1"

    # ------------------------------------------------------------------ counts

    def in_use(self, name: str) -> int:
        """Requests for ``name`` here in flight or waiting for its load, every process."""
        return self.local.get(name, 0) + self.remote.get(name, 0)

    def start(self, name: str | None, now: float) -> None:
        """A request of this process for ``name`` (None: the base model) goes to the replica."""
        self.inflight += 1
        if name is None:
            return
        self.local[name] = self.local.get(name, 0) + 1
        self.asked[name] = self.asked.get(name, 0) + 1
        if self.residents.change(name, last_used=now) is None:
            self.changed(name)

    def finish(self, name: str | None, now: float) -> None:
        """That request is over."""
        self.inflight -= 1
        if name is None:
            return
        left = self.local.get(name, 0) - 1
        if left > 0:
            self.local[name] = left
        else:
            self.local.pop(name, None)
        if self.residents.change(name, last_used=now) is None:
            self.changed(name)

    def set_remote(self, name: str, marks: int) -> None:
        if self.remote.get(name, 0) != marks:
            if marks:
                self.remote[name] = marks
            else:
                self.remote.pop(name, None)
            self.changed(name)

    # ------------------------------------------------------------------ placement

    def snapshot(self, name: str) -> Residency:
        """The placement copy of ``name``'s fact: in-flight and requests filled in (cached)."""
        snap = self._snaps.get(name)
        if snap is None:
            r = self.residents[name]
            snap = replace(r, inflight=self.in_use(name), requests=self.asked.get(name, 0))
            self._snaps[name] = snap
        return snap

    def view(self) -> ReplicaView:
        """An immutable snapshot for placement (cached until the state changes)."""
        cached = self._view
        if cached is not None:
            return cached
        m = self.metrics
        pool = self.pool
        view = ReplicaView(
            url=self.url,
            pool=pool.name,
            healthy=self.healthy,
            max_loras=m.max_lora or pool.max_loras,
            max_adapters=pool.evict_bound,
            residents={n: self.snapshot(n) for n in self.residents},
            inflight=self.inflight,
            running=m.running,
            waiting=m.waiting,
            kv_cache_usage=m.kv_cache_usage,
            lora_running=m.lora_running,
            lora_waiting=m.lora_waiting,
            max_num_seqs=pool.max_num_seqs,
            max_cpu_loras=pool.max_cpu_loras or 0,
            max_lora_rank=pool.max_lora_rank or 0,
            reserved_hot_slots=pool.reserved_hot_slots,
        )
        object.__setattr__(self, "_view", view)
        return view


def views(replicas: list[ReplicaState]) -> list[ReplicaView]:
    """The placement views of ``replicas`` (cached ones as they are; rebuilt where stale)."""
    return [r._view or r.view() for r in replicas]
