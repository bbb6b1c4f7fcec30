"""Placement index: the ``default`` profile's decisions without a pass over every replica.

:class:`PlacementIndex` holds the views of one set of replicas (the router keeps one per base
model) under integer *slots* whose order is the snapshot's order, and is told of every change
(:meth:`PlacementIndex.put`: a replica added, changed or removed). It keeps, updated
incrementally per changed replica:

* **orders of replicas** (sorted lists of tuples, ``bisect``): by ``k = b + d`` (the part of a
  total that does not depend on the request: running-set room and load, as the fused path's row
  holds them) in six classes — saturated or not (load ≥ high water, or running set full) ×
  free registration slot / full but able to evict / full with nothing idle — and by ``d`` (load)
  in two classes (load ≥ high water or not). A free replica's tuple also carries ``b`` and ``d``
  (equal tuples, equal totals); a full one's carries the key of its cheapest idle adapter
  (``EvictionCostScorer.key_of``, or the LRU idle adapter's ``last_used`` with ``free-slot``):
  within equal ``k`` a lower key can only mean a higher eviction score.
* **per adapter** (:class:`AdapterStats`): the healthy replicas holding it with their records,
  those where it is present with requests in flight (also in load order), those where it is
  ``failed``/``unloading``,
  and counts (resident copies, non-failed copies, in-flight, present copies, their in-flight,
  present copies not saturated).

:mod:`router.placement.index_pick` decides from these (best-first scans with upper bounds)
exactly as ``DefaultProfile.pick`` would on the list of the healthy, not excluded views in slot
order (``tests/router/test_placement_index.py``).
"""

from __future__ import annotations

import math
from bisect import bisect_left, insort
from typing import TYPE_CHECKING

from router.placement.framework import PRESENT
from router.placement.types import ReplicaView, Resident

if TYPE_CHECKING:
    from router.placement.fused import DefaultProfile, _Row

FREE, EVICT, NONE = 0, 1, 2  # registration-slot classes (k orders: 3 × saturated + class)

KKey = tuple[float, float, float, int]  # (-k, -b | victim key | 0, -d | 0, slot)
DKey = tuple[float, int]  # (-d, slot)


class AdapterStats:
    """One adapter over the healthy replicas of the index that hold it."""

    __slots__ = (
        "busy",
        "busy_order",
        "demand",
        "held",
        "inflight",
        "nonfailed",
        "other",
        "present",
        "resident",
        "unsat",
    )

    def __init__(self) -> None:
        self.held: dict[int, Resident] = {}  # slot → its record there (any state)
        self.busy: dict[int, Resident] = {}  # present (staging/loading/resident), in-flight ≠ 0
        self.busy_order: list[DKey] = []  # the busy copies' replicas, least loaded first
        self.other: dict[int, Resident] = {}  # failed / unloading there
        self.resident = 0  # copies in state resident
        self.nonfailed = 0  # copies in a state other than failed (hot-copy count)
        self.inflight = 0  # Σ in-flight, any state (the evictors' demand)
        self.present = 0  # copies present
        self.demand = 0  # Σ in-flight of the present copies (resident-affinity's demand)
        self.unsat = 0  # present copies not saturated (resident-affinity's "free" holders)


class Entry:
    """One replica of the index: its view, the fused path's row and its place in the orders."""

    __slots__ = ("cap", "dcls", "dkey", "full", "healthy", "kcls", "kkey", "loadsat", "row", "view")

    def __init__(self, view: ReplicaView, row: _Row) -> None:
        self.view = view
        self.row = row
        self.healthy = row.s is not None
        self.loadsat = False  # load >= high_water
        self.full = False  # running set full
        self.cap = 1  # max_num_seqs (≥ 1)
        self.kcls = -1
        self.kkey: KKey = (0.0, 0.0, 0.0, 0)
        self.dcls = -1
        self.dkey: DKey = (0.0, 0)

    def flags(self) -> tuple[bool, bool, bool, int]:
        """What an adapter's contribution depends on besides its own record."""
        return (self.healthy, self.loadsat, self.full, self.cap)


class PlacementIndex:
    """The replicas of one snapshot, indexed for ``profile`` (see the module docstring)."""

    def __init__(self, profile: DefaultProfile) -> None:
        self.profile = profile
        self.signature = profile.index_signature()
        aff = profile.affinity
        self.hw, self.ah = aff.high_water, aff.adapter_high
        self.entries: dict[int, Entry] = {}
        self.views: list[ReplicaView | None] = []  # by slot (shared with decisions: copy on write)
        self._shared = False
        self.slots: dict[str, list[int]] = {}  # url → slots (healthy or not)
        self.adapters: dict[str, AdapterStats] = {}
        self.korders: list[list[KKey]] = [[] for _ in range(6)]
        self.dorders: list[list[DKey]] = [[], []]
        self.caps: dict[int, int] = {}  # max_num_seqs → healthy replicas with it
        self.healthy = 0

    # ------------------------------------------------------------------ updates

    def put(self, slot: int, view: ReplicaView | None) -> None:
        """Replica ``slot`` is now ``view`` (None: removed)."""
        old = self.entries.pop(slot, None)
        new = self._entry(slot, view) if view is not None else None
        if old is not None:
            self._unorder(old)
        if new is not None:
            self._order(new)
            self.entries[slot] = new
        if old is not None and new is not None and old.flags() == new.flags():
            before, after = old.view.residents, new.view.residents
            moved = old.healthy and old.dkey != new.dkey  # the busy copies kept: a new load
            if before is not after or moved:
                for name, r in before.items():
                    if after.get(name) is not r:
                        self._count(slot, name, r, old, -1)
                    elif moved and r.inflight and r.state in PRESENT:
                        lst = self.adapters[name].busy_order
                        del lst[bisect_left(lst, old.dkey)]
                        insort(lst, new.dkey)
                for name, r in after.items():
                    if before.get(name) is not r:
                        self._count(slot, name, r, new, 1)
        else:
            if old is not None:
                for name, r in old.view.residents.items():
                    self._count(slot, name, r, old, -1)
            if new is not None:
                for name, r in new.view.residents.items():
                    self._count(slot, name, r, new, 1)
        self._set_view(slot, old, new)

    def _set_view(self, slot: int, old: Entry | None, new: Entry | None) -> None:
        if self._shared:
            self.views = self.views.copy()
            self._shared = False
        views = self.views
        if slot >= len(views):
            views.extend([None] * (slot + 1 - len(views)))
        views[slot] = new.view if new is not None else None
        if old is not None and (new is None or new.view.url != old.view.url):
            slots = self.slots[old.view.url]
            slots.remove(slot)
            if not slots:
                del self.slots[old.view.url]
        if new is not None and (old is None or new.view.url != old.view.url):
            self.slots.setdefault(new.view.url, []).append(slot)

    def freeze(self) -> list[ReplicaView | None]:
        """The views by slot as they are now (unchanged by later updates)."""
        self._shared = True
        return self.views

    def _entry(self, slot: int, view: ReplicaView) -> Entry:
        p = self.profile
        row = view.derived.get(p._key) or p._row(view)
        e = Entry(view, row)
        s = row.s
        if s is None:
            return e
        e.loadsat = s.load >= self.hw
        e.full = s.full
        e.cap = s.cap
        k = row.b + row.d
        sat = 3 if e.loadsat or e.full else 0
        if s.free:
            e.kcls, e.kkey = sat + FREE, (-k, -row.b, -row.d, slot)
        elif s.takes_new:
            e.kcls, e.kkey = sat + EVICT, (-k, self._victim_key(view), 0.0, slot)
        else:
            e.kcls, e.kkey = sat + NONE, (-k, 0.0, 0.0, slot)
        e.dcls, e.dkey = (1 if e.loadsat else 0), (-row.d, slot)
        return e

    def _victim_key(self, view: ReplicaView) -> float:
        """The key of a full replica's cheapest idle adapter (lower: cheaper to evict)."""
        p = self.profile
        s = p._row(view).s if p._key not in view.derived else view.derived[p._key].s
        assert s is not None
        cost = p._cost
        if cost is not None:
            r = cost.cheapest(view, s)
            key = cost.key_of(r) if r is not None else math.inf
        else:
            key = s.lru_last_used if s.lru_last_used is not None else math.inf
        return -math.inf if key != key else key

    def _order(self, e: Entry) -> None:
        if e.healthy:
            insort(self.korders[e.kcls], e.kkey)
            insort(self.dorders[e.dcls], e.dkey)
            self.healthy += 1
            self.caps[e.cap] = self.caps.get(e.cap, 0) + 1

    def _unorder(self, e: Entry) -> None:
        if e.healthy:
            lst = self.korders[e.kcls]
            del lst[bisect_left(lst, e.kkey)]
            dl = self.dorders[e.dcls]
            del dl[bisect_left(dl, e.dkey)]
            self.healthy -= 1
            n = self.caps[e.cap] - 1
            if n:
                self.caps[e.cap] = n
            else:
                del self.caps[e.cap]

    def unsat(self, e: Entry, r: Resident) -> bool:
        """Whether a present record ``r`` on ``e`` is a holder resident-affinity calls free."""
        f = r.inflight
        return not (e.loadsat or ((f / e.cap >= self.ah) if f else e.full))

    def _count(self, slot: int, name: str, r: Resident, e: Entry, sign: int) -> None:
        """Add (sign 1) or remove (-1) the record ``r`` of ``name`` on replica ``e``."""
        if not e.healthy:
            return
        a = self.adapters.get(name)
        if a is None:
            a = self.adapters[name] = AdapterStats()
        st = r.state
        f = r.inflight
        if sign > 0:
            a.held[slot] = r
        else:
            del a.held[slot]
        a.inflight += sign * f
        if st == "resident":
            a.resident += sign
        if st != "failed":
            a.nonfailed += sign
        if st in PRESENT:
            a.present += sign
            a.demand += sign * f
            if f:
                if sign > 0:
                    a.busy[slot] = r
                    insort(a.busy_order, e.dkey)
                else:
                    del a.busy[slot]
                    del a.busy_order[bisect_left(a.busy_order, e.dkey)]
            if self.unsat(e, r):
                a.unsat += sign
        elif sign > 0:
            a.other[slot] = r
        else:
            del a.other[slot]
        if sign < 0 and not a.held:
            del self.adapters[name]

    # ------------------------------------------------------------------ readers

    def excluded(self, urls: frozenset[str]) -> set[int]:
        """The healthy slots whose url is in ``urls``."""
        out: set[int] = set()
        for u in urls:
            for slot in self.slots.get(u, ()):
                if self.entries[slot].healthy:
                    out.add(slot)
        return out

    def candidates(self, views: list[ReplicaView | None], exclude: frozenset[str]) -> list[ReplicaView]:
        """The snapshot list the index stands for: healthy views not in ``exclude``, by slot."""
        return [v for v in views if v is not None and v.healthy and v.url not in exclude]

    def valid(self) -> bool:
        """Whether the profile still runs the pipeline (and parameters) this index was built for."""
        p = self.profile
        return p._planned() and p.index_signature() == self.signature
