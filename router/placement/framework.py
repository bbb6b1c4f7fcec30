"""Placement framework: Filter → weighted Scorer in [0, 1] → Picker (DESIGN.md example 8).

A :class:`SchedulerProfile` runs, for one request and one snapshot of replicas:

1. every :class:`Filter` in order (each drops replicas; an empty result ends the pick with
   ``Decision(replica=None, action="none")`` and the filter's name in ``reason``);
2. every :class:`Scorer` — each returns one score in [0, 1] per remaining replica (clamped), and
   the profile sums ``weight × score``;
3. its :class:`Picker`, which chooses one index from the totals;

then derives the action (``hit`` / ``load`` / ``replicate``) and, when the chosen replica is at
``max_adapters``, the least recently used idle adapters to unload first (``Decision.evict``).

Everything is a pure function of ``(request, replicas, now)``; the only state is what a picker
holds in its own instance (a seeded RNG, a round-robin counter). Per-snapshot facts derived from
``ReplicaView.residents`` are memoised in ``ReplicaView.derived`` (see :func:`summary`), so a
decision is O(replicas) with O(1) work per replica once a view has been summarised.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Mapping, Sequence
from itertools import repeat
from operator import attrgetter
from typing import ClassVar, Protocol

from router.placement.tiers import tier_of
from router.placement.types import Action, Decision, PlacementRequest, ReplicaView, Residency, Scores

# Residency states that hold a registration slot on the replica (count towards max_adapters).
OCCUPYING = frozenset({"staging", "loading", "resident", "unloading"})
# States meaning "the adapter is there or about to be": requests can be sent (the loader joins).
PRESENT = frozenset({"staging", "loading", "resident"})

_RESIDENTS = attrgetter("residents")
_INFLIGHT = attrgetter("inflight")
_LRU_KEY = attrgetter("last_used", "lora_name")  # idle LRU order: oldest first, ties by name
_LAST_USED = attrgetter("last_used")


class Summary:
    """Facts about one replica snapshot derived from its residents (memoised per view; read-only)."""

    __slots__ = (
        "_idle",
        "_idle_lru",
        "cap",
        "free",
        "full",
        "load",
        "lru_last_used",
        "occupied",
        "room",
        "running",
        "takes_new",
    )

    occupied: int  # residents holding a registration slot (OCCUPYING states)
    running: int  # distinct adapters with router in-flight requests (the running set)
    load: float  # load_fraction(view)
    free: bool  # occupied < max_adapters: one more adapter fits without eviction
    room: float  # running-set score of an adapter not running there (see RunningSetScorer)
    lru_last_used: float | None  # last_used of the LRU idle resident (None: nothing idle)
    full: bool  # running >= max_loras: a new adapter would be deferred
    takes_new: bool  # a new adapter can be registered (free slot, or enough idle to evict)
    cap: int  # max_num_seqs (≥ 1)

    def __init__(
        self,
        occupied: int,
        running: int,
        idle: list[Residency],
        load: float,
        free: bool,
        room: float,
        lru_last_used: float | None,
        full: bool,
        takes_new: bool,
        cap: int,
    ) -> None:
        self.occupied = occupied
        self.running = running
        self._idle = idle  # idle residents, unordered (sorted on first use of idle_lru)
        self._idle_lru: tuple[Residency, ...] | None = None
        self.load = load
        self.free = free
        self.room = room
        self.lru_last_used = lru_last_used
        self.full = full
        self.takes_new = takes_new
        self.cap = cap

    @property
    def idle_lru(self) -> tuple[Residency, ...]:
        """``resident`` adapters with no in-flight request, oldest first (ties: by name).

        Sorted on first use: only the chosen replica of an eviction needs the order."""
        lru = self._idle_lru
        if lru is None:
            lru = self._idle_lru = tuple(sorted(self._idle, key=_LRU_KEY))
        return lru

    def __repr__(self) -> str:
        return (
            f"Summary(occupied={self.occupied}, running={self.running}, idle={len(self._idle)}, "
            f"load={self.load}, free={self.free}, room={self.room}, lru_last_used={self.lru_last_used}, "
            f"full={self.full}, takes_new={self.takes_new}, cap={self.cap})"
        )


def summary(view: ReplicaView) -> Summary:
    """Return (and memoise on the view) the :class:`Summary` of ``view``'s residents."""
    cached = view.derived.get("summary")
    if cached is not None:
        return cached  # type: ignore[no-any-return]
    occupied = 0
    running = 0
    idle: list[Residency] = []
    occupying = OCCUPYING
    for r in view.residents.values():
        if r.state in occupying:
            occupied += 1
        if r.inflight > 0:
            running += 1
        elif r.state == "resident":
            idle.append(r)
    m = view.max_loras
    ma = view.max_adapters
    cap = view.max_num_seqs if view.max_num_seqs > 0 else 1
    f = (view.inflight + view.waiting) / cap  # load_fraction(view), inlined
    lru: float | None = None  # idle_lru[0].last_used without sorting: the min of a total order
    if idle:
        lru = min(map(_LAST_USED, idle))
        total = sum(map(_LAST_USED, idle))
        if total != total:  # a NaN among them: no total order, take the sorted order's first
            lru = sorted(idle, key=_LRU_KEY)[0].last_used
    s = Summary(
        occupied,
        running,
        idle,
        1.0 if f > 1.0 else f,
        occupied < ma,
        (0.7 + 0.2 * (1.0 - running / m)) if running < m else 0.4 / (1 + running - m),
        lru,
        running >= m,
        occupied < ma or len(idle) >= occupied - ma + 1,
        cap,
    )
    view.derived["summary"] = s
    return s


def load_fraction(view: ReplicaView) -> float:
    """Replica load in [0, 1]: (router in-flight + scraped waiting) / max_num_seqs, capped at 1."""
    cap = view.max_num_seqs if view.max_num_seqs > 0 else 1
    f = (view.inflight + view.waiting) / cap
    return 1.0 if f > 1.0 else f


class PickContext:
    """What plugins see for one pick: the request, the candidate views and derived lookups."""

    __slots__ = ("_maps", "_sums", "all_replicas", "held", "now", "replicas", "request")

    def __init__(self, request: PlacementRequest, replicas: list[ReplicaView], now: float) -> None:
        self.request = request
        self.all_replicas = replicas  # the whole snapshot, before any filter
        self.replicas = replicas  # the candidates left by the filters so far
        self.now = now
        # index → the requested adapter's Residency, for the replicas that have one
        # (usually few; base-model requests: none).
        name = request.lora_name
        self.held: dict[int, Residency] = (
            {i: r for i, v in enumerate(replicas) if (r := v.residents.get(name)) is not None}
            if name is not None
            else {}
        )
        self._sums: list[Summary] | None = None
        self._maps: list[dict[str, Residency]] | None = None

    def adapter_inflight(self, name: str) -> int:
        """In-flight requests of adapter ``name`` summed over every replica of the snapshot
        (``all_replicas``) that holds it, in any state (the evictors' demand)."""
        maps = self._maps
        if maps is None:
            maps = self._maps = list(map(_RESIDENTS, self.all_replicas))
        # C-level iteration: residents.get per replica, drop the misses, add the in-flight counts.
        return sum(map(_INFLIGHT, filter(None, map(dict.get, maps, repeat(name)))))

    def healthy_copies(self, name: str) -> int:
        """Replicas of the snapshot that are healthy and hold ``name`` in a state other than
        ``failed`` (the copies hot-copy targets count)."""
        copies = 0
        for v in self.all_replicas:
            r = v.residents.get(name)
            if r is not None and v.healthy and r.state != "failed":
                copies += 1
        return copies

    @property
    def targets(self) -> list[Residency | None]:
        """The adapter's Residency on each candidate (None where absent)."""
        held = self.held
        return [held.get(i) for i in range(len(self.replicas))]

    @property
    def sums(self) -> list[Summary]:
        """The :func:`summary` of each candidate (same order as ``replicas``)."""
        s = self._sums
        if s is None:
            s = self._sums = [v.derived.get("summary") or summary(v) for v in self.replicas]
        return s

    def narrow(self, keep: list[int]) -> None:
        """Keep only the replicas at indices ``keep`` (used between filters)."""
        self.replicas = [self.replicas[i] for i in keep]
        if self.held:  # keep is sorted: map the few held indices by bisection
            held: dict[int, Residency] = {}
            for i, r in self.held.items():
                j = bisect_left(keep, i)
                if j < len(keep) and keep[j] == i:
                    held[j] = r
            self.held = held
        if self._sums is not None:
            self._sums = [self._sums[i] for i in keep]


class Filter:
    """Drops replicas. Subclasses set ``name``/``reads`` and implement :meth:`keep`."""

    name: ClassVar[str] = "filter"
    reads: ClassVar[frozenset[str]] = frozenset()

    def keep(self, ctx: PickContext) -> list[int] | None:
        """Ascending indices (into ``ctx.replicas``) of the replicas to keep; None keeps them all."""
        raise NotImplementedError


class Scorer:
    """Scores replicas in [0, 1]. Subclasses set ``name``/``reads`` and implement :meth:`score`."""

    name: ClassVar[str] = "scorer"
    reads: ClassVar[frozenset[str]] = frozenset()
    # True when score() is guaranteed to return values in [0, 1] (the profile then skips clamping).
    bounded: ClassVar[bool] = False

    def score(self, ctx: PickContext) -> list[float]:
        """One score in [0, 1] per replica of ``ctx.replicas`` (same order)."""
        raise NotImplementedError


class Picker:
    """Chooses one replica index from the weighted totals."""

    name: ClassVar[str] = "picker"

    def pick(self, ctx: PickContext, totals: list[float]) -> int:
        raise NotImplementedError


class EvictionInput(Protocol):
    """What an evictor reads: the request, the chosen replica, and counts over the snapshot."""

    request: PlacementRequest
    now: float
    view: ReplicaView

    def idle_lru(self) -> Sequence[Residency]:
        """The chosen replica's idle ``resident`` adapters, least recently used first."""
        ...

    def adapter_inflight(self, name: str) -> int:
        """In-flight requests of ``name`` summed over the snapshot's replicas holding it."""
        ...

    def healthy_copies(self, name: str) -> int:
        """Healthy replicas of the snapshot holding ``name`` in a state other than ``failed``."""
        ...


class Chosen:
    """:class:`EvictionInput` for ``ctx.replicas[index]`` of a pipeline pick."""

    __slots__ = ("_ctx", "_index", "now", "request", "view")

    def __init__(self, ctx: PickContext, index: int) -> None:
        self._ctx = ctx
        self._index = index
        self.request = ctx.request
        self.now = ctx.now
        self.view = ctx.replicas[index]

    def idle_lru(self) -> Sequence[Residency]:
        return self._ctx.sums[self._index].idle_lru

    def adapter_inflight(self, name: str) -> int:
        return self._ctx.adapter_inflight(name)

    def healthy_copies(self, name: str) -> int:
        return self._ctx.healthy_copies(name)


class Evictor:
    """Chooses which adapters to unload from the chosen replica when it is at ``max_adapters``.

    The base version takes the least recently used idle residents (never one with in-flight
    requests, never one still loading). Subclasses (``evictors.py``) keep hot and planned copies.
    """

    name: ClassVar[str] = "lru-idle-plain"

    def victims(self, inp: EvictionInput, need: int) -> tuple[str, ...] | None:
        """``need`` lora_names to unload from ``inp.view``, or None if impossible."""
        idle = inp.idle_lru()
        if len(idle) < need:
            return None
        return tuple(r.lora_name for r in idle[:need])


def can_host(view: ReplicaView, target: Residency | None, s: Summary | None = None) -> bool:
    """True when ``view`` holds the adapter already or can register one more (maybe by eviction)."""
    if target is not None and target.state in PRESENT:
        return True
    return (s or summary(view)).takes_new


def _weighted_sum(columns: list[list[float]], weights: tuple[float, ...], n: int) -> list[float]:
    """Σ weight × score per replica, in one pass over the columns (common widths unrolled)."""
    if len(columns) == 4:
        a, b, c, d = columns
        wa, wb, wc, wd = weights
        return [wa * p + wb * q + wc * r + wd * s for p, q, r, s in zip(a, b, c, d, strict=True)]
    if len(columns) == 3:
        a, b, c = columns
        wa, wb, wc = weights
        return [wa * p + wb * q + wc * r for p, q, r in zip(a, b, c, strict=True)]
    if not columns:
        return [0.0] * n
    totals = [weights[0] * x for x in columns[0]]
    for w, col in zip(weights[1:], columns[1:], strict=True):
        totals = [t + w * x for t, x in zip(totals, col, strict=True)]
    return totals


class SchedulerProfile:
    """A named placement policy: filters → weighted scorers → picker (+ evictor).

    Implements the ``Profile`` protocol of :mod:`router.placement.types`.
    """

    def __init__(
        self,
        name: str,
        filters: Sequence[Filter],
        scorers: Sequence[tuple[Scorer, float]],
        picker: Picker,
        evictor: Evictor | None = None,
    ) -> None:
        for scorer, weight in scorers:
            if weight < 0:
                raise ValueError(f"scorer {scorer.name!r}: weight must be >= 0, got {weight}")
        self.name = name
        self.filters = tuple(filters)
        self.scorers = tuple((s, float(w)) for s, w in scorers if w > 0)
        self._weights = tuple(w for _, w in self.scorers)
        self.picker = picker
        self.evictor = evictor or Evictor()

    def describe(self) -> dict[str, object]:
        """A JSON-able description of the pipeline (for logs and the admin API)."""
        return {
            "name": self.name,
            "filters": [f.name for f in self.filters],
            "scorers": [[s.name, w] for s, w in self.scorers],
            "picker": self.picker.name,
            "evictor": self.evictor.name,
        }

    def pick(self, request: PlacementRequest, replicas: list[ReplicaView], now: float) -> Decision:
        ctx = PickContext(request, replicas, now)
        for f in self.filters:
            if not ctx.replicas:
                break
            keep = f.keep(ctx)
            if keep is not None and len(keep) != len(ctx.replicas):
                if not keep:
                    return Decision(replica=None, action="none", reason=f"no replica left after {f.name}")
                ctx.narrow(keep)
        n = len(ctx.replicas)
        if n == 0:
            return Decision(replica=None, action="none", reason="no replicas")
        columns: list[list[float]] = []
        for scorer, _ in self.scorers:
            scores = scorer.score(ctx)
            if len(scores) != n:
                raise ValueError(f"scorer {scorer.name!r} returned {len(scores)} scores for {n} replicas")
            if not scorer.bounded:  # clamp to [0, 1]; NaN → 0
                scores = [(1.0 if x > 1.0 else x) if x >= 0.0 else 0.0 for x in scores]
            columns.append(scores)
        totals = _weighted_sum(columns, self._weights, n)
        index = self.picker.pick(ctx, totals)
        return self._decide(ctx, totals, index)

    def _decide(self, ctx: PickContext, totals: list[float], index: int) -> Decision:
        view = ctx.replicas[index]
        scores = Scores([v.url for v in ctx.replicas], totals)
        name = ctx.request.lora_name
        if name is None:
            return Decision(replica=view.url, action="hit", scores=scores, reason="base model")
        target = ctx.held.get(index)
        if target is not None and target.state in PRESENT:
            return hit_decision(view, target, scores)
        elsewhere = False
        if ctx.all_replicas is ctx.replicas:  # no filter dropped anything: targets cover all
            for t in ctx.held.values():
                if t.state == "resident":
                    elsewhere = True
                    break
        else:
            for v in ctx.all_replicas:
                other = v.residents.get(name)
                if other is not None and other.state == "resident":
                    elsewhere = True
                    break
        action: Action = "replicate" if elsewhere else "load"
        need = ctx.sums[index].occupied - view.max_adapters + 1
        victims = self.evictor.victims(Chosen(ctx, index), need) if need > 0 else ()
        return load_decision(view, action, victims, scores)


def hit_decision(view: ReplicaView, target: Residency, scores: Mapping[str, float]) -> Decision:
    """The decision for a replica where the adapter is present (``target.state`` in PRESENT)."""
    reason = "resident" if target.state == "resident" else f"joining {target.state}"
    return Decision(
        replica=view.url, action="hit", scores=scores, reason=reason, tier=tier_of(view, target.lora_name)
    )


def load_decision(
    view: ReplicaView, action: Action, victims: tuple[str, ...] | None, scores: Mapping[str, float]
) -> Decision:
    """The decision to load onto ``view`` after unloading ``victims`` (the evictor's answer;
    None: the replica is at max_adapters with nothing to evict)."""
    if victims is None:  # only reachable without the capacity filter
        return Decision(
            replica=None,
            action="none",
            scores=scores,
            reason=f"{view.url} is at max_adapters with no idle adapter to evict",
        )
    reason = f"{action}; evict {','.join(victims)}" if victims else action
    return Decision(replica=view.url, action=action, evict=victims, scores=scores, reason=reason, tier="load")
