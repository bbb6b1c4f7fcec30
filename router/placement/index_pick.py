"""The ``default`` profile's decision from a :class:`~router.placement.index.PlacementIndex`.

``pick(index, request, now)`` returns exactly ``DefaultProfile.pick(request, L, now)`` where
``L`` is the index's healthy views not in ``request.exclude``, in slot order — without looking
at every replica:

* **Holders of the adapter.** With at most ``FEW`` holders, they are scored as the fused path
  scores them (``fused_holders.score_holders``). With more, resident-affinity's case (spread,
  consolidate, every copy saturated) comes from the adapter's counts; the copies with requests
  in flight are taken least loaded first (the adapter's own load order) and the idle ones by a
  scan of the ``k`` orders, skipping replicas that do not hold it.
* **Other replicas.** Scans of the ``k`` orders of replicas with a free slot and of those that
  evict, skipping holders and excluded ones.

Every scan is best-first with an upper bound of the totals still to come (a total is a float sum
of non-negative terms, so ``(constant + k) × (1 + 1e-12)`` bounds it), and stops when the bound
falls below ``top − 1e-9`` (the max-score picker's tie margin); the pick is then the lowest slot
within the margin of the top, as ``MaxScorePicker`` takes the first. Runs of equal tuples
(equal totals) are skipped after their first candidate, and within a run of equal ``k`` the
replicas that evict are ordered by the key of their cheapest idle adapter, whose score bounds
theirs. Whatever this does not cover (another evictor than the built-in ones, several
``max_num_seqs`` values, the primary copy of a consolidating adapter among its idle copies,
no candidate left) runs ``DefaultProfile.pick`` on the list itself.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections.abc import Callable
from typing import TYPE_CHECKING

from router.placement.framework import PRESENT, PickContext, hit_decision, load_decision
from router.placement.fused_holders import score_holders
from router.placement.index import EVICT, FREE, AdapterStats, Entry, PlacementIndex
from router.placement.pickers import _EPS
from router.placement.types import Action, Decision, PlacementRequest, ReplicaView, Resident, Scores

if TYPE_CHECKING:
    from router.placement.fused import DefaultProfile

_Aff = Callable[[int, bool, str], float]  # (slot, saturated, state) → resident-affinity
FEW = 8  # holders scored one by one
_UP = 1.0 + 1e-12  # bound of the rounding of a four-term sum of non-negative floats
_NEG = -math.inf
_INF = math.inf
_LN2 = math.log(2.0)


class _Search:
    """One decision's candidates: every total offered, the running top and its tie floor."""

    __slots__ = ("a", "exs", "floor", "ix", "name", "now", "offers", "p", "top", "views")

    def __init__(self, ix: PlacementIndex, exs: set[int], name: str | None, now: float) -> None:
        self.ix = ix
        self.p = ix.profile
        self.views = ix.views
        self.exs = exs
        self.name = name
        self.now = now
        self.top = _NEG
        self.floor = _NEG
        self.offers: list[tuple[int, float]] = []
        self.a: AdapterStats | None = ix.adapters.get(name) if name is not None else None

    def offer(self, slot: int, t: float) -> None:
        self.offers.append((slot, t))
        if t > self.top:
            self.top = t
            self.floor = t - _EPS

    def choose(self) -> int:
        floor = self.top - _EPS  # MaxScorePicker: the first within _EPS of the top
        return min(slot for slot, t in self.offers if t >= floor)

    # ------------------------------------------------------------------ base-model requests

    def base(self) -> None:
        w1, w2, w3, _ = self.p._w
        c = w1 * 0.0 + w2 * 1.0 + w3 * 1.0
        entries, exs = self.ix.entries, self.exs
        for lst in self.ix.dorders:
            i, n = 0, len(lst)
            while i < n:
                nd, slot = lst[i]
                if (c - nd) * _UP < self.floor:
                    break
                if slot in exs:
                    i += 1
                    continue
                self.offer(slot, entries[slot].row.base)
                i = bisect_right(lst, (nd, _INF), i)  # equal load, equal total: lowest slot only

    # ------------------------------------------------------------------ other replicas

    def total(self, e: Entry) -> float:
        """The total of a replica that does not hold the adapter (as the fused comprehension)."""
        r = e.row
        return r.t if r.sat <= self.now < r.hi else self.p._slow(r, self.now)

    def free_replicas(self) -> None:
        name, views, entries, exs = self.name, self.views, self.ix.entries, self.exs
        w3 = self.p._w[2] * 1.0
        for lst in (self.ix.korders[FREE], self.ix.korders[3 + FREE]):
            i, n = 0, len(lst)
            while i < n:
                nk, kb, kd, slot = lst[i]
                if (w3 - nk) * _UP < self.floor:
                    break
                v = views[slot]
                if slot in exs or (v is not None and name in v.residents):
                    i += 1
                    continue
                self.offer(slot, self.total(entries[slot]))
                i = bisect_right(lst, (nk, kb, kd, _INF), i)  # equal b and d: equal totals

    def evicting_replicas(self) -> None:
        name, views, entries, exs = self.name, self.views, self.ix.entries, self.exs
        w3 = self.p._w[2]
        cost = self.p._cost
        smax = w3 * (cost.top if cost is not None else 0.6)
        bound = self._slot_bound()
        for lst in (self.ix.korders[EVICT], self.ix.korders[3 + EVICT]):
            i, n = 0, len(lst)
            while i < n:
                nk, kv, _, slot = lst[i]
                if (smax - nk) * _UP < self.floor:
                    break
                if (w3 * bound(kv) - nk) * _UP < self.floor:  # the rest of this k: no better
                    i = bisect_right(lst, (nk, _INF, _INF, _INF), i)
                    continue
                i += 1
                v = views[slot]
                if slot in exs or (v is not None and name in v.residents):
                    continue
                self.offer(slot, self.total(entries[slot]))

    def _slot_bound(self) -> _SlotBound:
        cost = self.p._cost
        if cost is None:
            return _FreeSlotBound(self.p._h, self.now)
        return _CostBound(self.p, self.now)

    def other_unsaturated(self) -> bool:
        """A candidate not holding the adapter that is not saturated (load, running set)."""
        name, views, exs = self.name, self.views, self.exs
        for lst in (self.ix.korders[FREE], self.ix.korders[EVICT]):
            for key in lst:
                slot = key[3]
                v = views[slot]
                if slot not in exs and v is not None and name not in v.residents:
                    return True
        return False


class _SlotBound:
    def __call__(self, key: float) -> float:
        raise NotImplementedError


class _FreeSlotBound(_SlotBound):
    """free-slot's score of a full replica whose LRU idle adapter was last used at ``key``
    (non-increasing in ``key``; exact for the replica itself)."""

    def __init__(self, h: float, now: float) -> None:
        self.h, self.now = h, now

    def __call__(self, key: float) -> float:
        f = (self.now - key) / self.h
        return 0.6 if f >= 1.0 else (0.1 + 0.5 * f if f > 0.0 else 0.1)


class _CostBound(_SlotBound):
    """An upper bound of eviction-cost's score of a full replica whose cheapest idle adapter has
    key ``key`` (``EvictionCostScorer.key_of``), non-increasing in ``key``: the price at second
    ``q`` is ``exp(key − q·ln2/half_life)`` when the adapter was last used by ``q``, else its
    undecayed price, at least ``load_fixed_s``."""

    def __init__(self, p: DefaultProfile, now: float) -> None:
        cost = p._cost
        assert cost is not None
        ev = cost.evictor
        self.top = cost.top
        self.cs = (ev.load_fixed_s if ev.load_fixed_s > 0 else 1.0) * cost.scale
        q = cost.bucket(now)
        self.qr = q * (_LN2 / ev.half_life_s) if q is not None else None
        self.floor = self._g(ev.load_fixed_s)

    def _g(self, v: float) -> float:
        return 0.1 + (self.top - 0.1) / (1.0 + v / self.cs)

    def __call__(self, key: float) -> float:
        qr = self.qr
        if qr is None or key == -_INF:
            return self.top
        if key == _INF:
            return self.floor
        x = key - qr
        x -= 1e-9 * (1.0 + abs(key) + abs(qr))  # rounding of key, q·rate and the price
        s = self._g(math.exp(x)) if x < 700.0 else 0.1
        return s if s > self.floor else self.floor


def pick(ix: PlacementIndex, request: PlacementRequest, now: float) -> Decision:
    """``profile.pick`` on the index's healthy, not excluded views (module docstring)."""
    from router.placement.fused import _CHOSEN_ONLY_EVICTORS

    p = ix.profile
    ex = request.exclude
    exs = ix.excluded(ex) if ex else set()
    if not ix.valid() or type(p.evictor) not in _CHOSEN_ONLY_EVICTORS:
        return p.pick(request, ix.candidates(ix.views, ex), now)
    if ix.healthy == len(exs):
        return p.pick(request, [], now)
    name = request.lora_name
    srch = _Search(ix, exs, name, now)
    elsewhere = False
    if name is None:
        srch.base()
    else:
        if srch.a is not None:
            held = _Holders(srch, srch.a)
            if not held.score():
                return p.pick(request, ix.candidates(ix.views, ex), now)
            elsewhere = held.elsewhere
        srch.free_replicas()
        srch.evicting_replicas()
    if srch.top == _NEG:  # no candidate: the fused path names the filter that emptied the list
        return p.pick(request, ix.candidates(ix.views, ex), now)
    return _decide(srch, request, srch.choose(), elsewhere)


def _spread(slot: int, sat: bool, st: str) -> float:
    """resident-affinity of a copy in the spread case: 1.0 (0.9 joining a load), saturated 0.3."""
    return 0.3 if sat else (1.0 if st == "resident" else 0.9)


class _Holders:
    """Scores the healthy, not excluded replicas holding the requested adapter."""

    def __init__(self, srch: _Search, a: AdapterStats) -> None:
        self.srch = srch
        self.a = a
        self.elsewhere = False

    def score(self) -> bool:
        """Offer every holder's total (or those that can matter); False: not covered."""
        srch, a, exs = self.srch, self.a, self.srch.exs
        ix = srch.ix
        gone = [slot for slot in exs if slot in a.held] if exs else []
        self.elsewhere = a.resident - sum(a.held[s].state == "resident" for s in gone) > 0
        if len(a.held) - len(gone) <= FEW:
            self._exact(gone)
            return True
        if len(ix.caps) != 1 or len(a.other) > FEW:
            self._exact(gone)
            return True
        present, demand, unsat = a.present, a.demand, a.unsat
        for slot in gone:
            t = a.held[slot]
            if t.state in PRESENT:
                present -= 1
                demand -= t.inflight
                unsat -= ix.unsat(ix.entries[slot], t)
        busy = a.busy
        self._others(gone)
        if present == 0:
            return True
        (cap,) = ix.caps
        p = srch.p
        if unsat > 0 and present > 1 and demand / cap < p.affinity.low_water:
            return self._consolidate(busy, gone)
        if unsat > 0:  # spread: free copies 1.0 (0.9 joining a load), saturated ones 0.3
            self._busy(busy, _spread, 1.0)
            self._idle(range(3), 1.0, 0.9)
            self._idle(range(3, 6), 0.3, 0.3)
            return True
        aa = 0.0 if srch.other_unsaturated() else 1.0  # every copy saturated
        self._busy(busy, lambda slot, sat, st: aa, aa)
        self._idle(range(3, 6), aa, aa)
        return True

    def _consolidate(self, busy: dict[int, Resident], gone: list[int]) -> bool:
        if len(busy) > FEW:
            return False
        busy = {s: t for s, t in busy.items() if s not in self.srch.exs} if gone else busy
        top = max((t.inflight for t in busy.values()), default=0)
        if top <= 0:
            return False  # the primary copy is an idle one: not covered
        firsts = [(t.inflight, t.last_used, -s) for s, t in busy.items() if t.inflight == top]
        if any(x[1] != x[1] for x in firsts):
            return False  # NaN last_used: max() depends on the order
        primary = -max(firsts)[2]

        def aff(slot: int, sat: bool, st: str) -> float:
            if sat:
                return 0.3
            return (1.0 if st == "resident" else 0.9) if slot == primary else 0.6

        self._busy(busy, aff, 1.0)
        self._idle(range(3), 0.6, 0.6)
        self._idle(range(3, 6), 0.3, 0.3)
        return True

    def _exact(self, gone: list[int]) -> None:
        srch = self.srch
        slots = sorted(s for s in self.a.held if s not in srch.exs) if gone else sorted(self.a.held)
        views = [srch.ix.entries[s].view for s in slots]
        out = [_NEG] * len(slots)
        score_holders(srch.p, srch.name or "", frozenset(), views, out, srch.now, srch.other_unsaturated)
        for slot, t in zip(slots, out, strict=True):
            if t != _NEG:
                srch.offer(slot, t)

    def _others(self, gone: list[int]) -> None:
        """failed/unloading copies: scored as any replica, with running-set 1.0 if in flight."""
        srch = self.srch
        p = srch.p
        w1, w2, w3, _ = p._w
        for slot, t in self.a.other.items():
            if slot in srch.exs:
                continue
            e = srch.ix.entries[slot]
            s = e.row.s
            assert s is not None
            if s.takes_new:
                b = 1.0 if t.inflight > 0 else s.room
                srch.offer(slot, w1 * 0.0 + w2 * b + w3 * p._free_slot(e.view, s, srch.now) + e.row.d)

    def _busy(self, busy: dict[int, Resident], aff: _Aff, amax: float) -> None:
        """Copies with requests in flight, least loaded first (the adapter's load order), until
        no total can reach the top (``amax``: the highest affinity any of them can get)."""
        srch = self.srch
        ix = srch.ix
        w1, w2, w3, _ = srch.p._w
        w_run, w_c = w2 * 1.0, w3 * 1.0
        c = w1 * amax + w_run + w_c
        exs, entries = srch.exs, ix.entries
        for nd, slot in self.a.busy_order:
            if (c - nd) * _UP < srch.floor:
                break
            if slot in exs:
                continue
            t = busy[slot]
            e = entries[slot]
            a = aff(slot, not ix.unsat(e, t), t.state)
            srch.offer(slot, w1 * a + (w_run if t.inflight > 0 else e.row.b) + w_c + e.row.d)

    def _idle(self, classes: range, a_res: float, a_join: float) -> None:
        """Present copies without requests in flight, on the replicas of the ``k`` orders
        ``classes`` (the unsaturated or the saturated ones): a scan skipping non-holders."""
        srch = self.srch
        ix = srch.ix
        w1, _, w3, _ = srch.p._w
        w_c = w3 * 1.0
        c = w1 * max(a_res, a_join) + w_c
        name, views, exs, present = srch.name or "", srch.views, srch.exs, PRESENT
        for cls in classes:
            for nk, _, _, slot in ix.korders[cls]:
                if (c - nk) * _UP < srch.floor:
                    break
                if slot in exs:
                    continue
                v = views[slot]
                t = v.residents.get(name) if v is not None else None
                if t is None or t.inflight or t.state not in present:
                    continue
                r = ix.entries[slot].row
                a = a_res if t.state == "resident" else a_join
                srch.offer(slot, w1 * a + r.b + w_c + r.d)


def _decide(srch: _Search, request: PlacementRequest, slot: int, elsewhere: bool) -> Decision:
    """``DefaultProfile._fused_decide`` for the chosen slot."""
    ix = srch.ix
    p = srch.p
    e = ix.entries[slot]
    view = e.view
    scores = _IndexScores(p, ix.freeze(), ix, request, srch.now)
    name = request.lora_name
    if name is None:
        return Decision(replica=view.url, action="hit", scores=scores, reason="base model")
    target = view.residents.get(name)
    if target is not None and target.state in PRESENT:
        return hit_decision(view, target, scores)
    action: Action = "replicate" if elsewhere else "load"
    s = e.row.s
    assert s is not None
    need = s.occupied - view.max_adapters + 1
    victims: tuple[str, ...] | None = ()
    if need > 0:
        ctx = IndexContext(ix, srch.exs, request, view, target, srch.now)
        ctx._sums = [s]
        victims = p.evictor.victims(ctx, 0, need)
    return load_decision(view, action, victims, scores)


class IndexContext(PickContext):
    """The evictor's context for the chosen replica, with the adapters' demand and hot copies
    over the snapshot read from the index."""

    __slots__ = ("_exs", "_ix")

    def __init__(
        self,
        ix: PlacementIndex,
        exs: set[int],
        request: PlacementRequest,
        view: ReplicaView,
        target: Resident | None,
        now: float,
    ) -> None:
        super().__init__(request, [view], now)
        self._ix = ix
        self._exs = exs
        # The built-in evictors (the only ones the index runs) read the snapshot only through
        # adapter_inflight() and healthy_copies(), answered from the index below.
        self.all_replicas = []

    def adapter_inflight(self, name: str) -> int:
        a = self._ix.adapters.get(name)
        if a is None:
            return 0
        return a.inflight - sum(a.held[s].inflight for s in self._exs if s in a.held)

    def healthy_copies(self, name: str) -> int:
        a = self._ix.adapters.get(name)
        if a is None:
            return 0
        return a.nonfailed - sum(a.held[s].state != "failed" for s in self._exs if s in a.held)


class _IndexScores(Scores):
    """``Decision.scores`` of an index decision: the fused path's scores of the snapshot list,
    computed only when read."""

    __slots__ = ("_src",)

    def __init__(
        self,
        p: DefaultProfile,
        views: list[ReplicaView | None],
        ix: PlacementIndex,
        request: PlacementRequest,
        now: float,
    ) -> None:
        super().__init__()
        self._src = (p, views, ix, request, now)

    def _dict(self) -> dict[str, float]:
        d = self._d
        if d is None:
            p, views, ix, request, now = self._src
            d = self._d = dict(p.pick(request, ix.candidates(views, request.exclude), now).scores)
        return d

    def __len__(self) -> int:
        return len(self._dict())
