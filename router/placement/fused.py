"""Fused fast path of the ``default`` profile: the same decisions as its generic pipeline.

:class:`DefaultProfile` is a :class:`SchedulerProfile` whose ``pick`` — when its pipeline is
exactly healthy → exclude → can-host, resident-affinity + running-set + eviction-cost (or
free-slot) + load with finite positive weights, max-score — computes the decision without the
generic stages:

* Per view (memoised in ``ReplicaView.derived`` under a key naming the weights and the
  free-slot horizon, next to the :func:`summary`), a :class:`_Row` holds what does not depend
  on the request: whether the replica passes healthy + can-host for an adapter it does not hold,
  and that replica's weighted total for such an adapter — ``((w1·0 + w2·room) + w3·free) +
  w4·(1 − load)``, the generic ``_weighted_sum`` order — for every ``now`` at or after a
  threshold (``sat``: from then on the free-slot score of its LRU idle adapter is the constant
  0.6; before it, the total is computed from ``now``); and the base-model total. With
  eviction-cost, which prices a full replica once per second (``floor(now)``), the row holds the
  total for one second, ``sat <= now < hi``, and a pick outside it prices the view again for its
  own second, through the scorer's own memo, so both paths give the same total.
* Per pick: one comprehension reads every replica's row total (``-inf`` marks a replica the
  filters drop); the few replicas holding the requested adapter get the exact generic scores
  (resident-affinity needs all holders at once); excluded URLs are set to ``-inf``; the pick is
  the first index within 1e-9 of the maximum (``MaxScorePicker``'s rule); action and eviction
  are derived as in ``SchedulerProfile._decide``; ``Decision.scores`` lists the same candidates
  with the same totals (built only when read).

Whatever the fast path does not cover — another pipeline (a weight set to 0, a different
scorer, filter or picker), or no candidate left (the generic path names the filter that emptied
the list) — runs the generic ``SchedulerProfile.pick``. ``tests/router/test_placement_fastpath.py``
checks decision-for-decision equality with the generic pipeline on random clusters.
Plugin parameters are read at each pick as the generic scorers read them (the idle horizon,
which the memo depends on, is checked); replacing ``filters``/``scorers``/``picker`` after
construction turns the fast path off; any ``evictor`` works (those that look only at the chosen
replica get a one-candidate context, others the generic pipeline's full one).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence

from router.placement.evictors import CostAwareEvictor, EvictionCostScorer, HotCopyEvictor, LruIdleEvictor
from router.placement.filters import CanHostFilter, ExcludeFilter, HealthyFilter
from router.placement.framework import (
    PRESENT,
    Evictor,
    Filter,
    PickContext,
    Picker,
    SchedulerProfile,
    Scorer,
    Summary,
    hit_decision,
    load_decision,
    summary,
)
from router.placement.fused_holders import score_holders
from router.placement.pickers import _EPS, MaxScorePicker
from router.placement.scorers import FreeSlotScorer, LoadScorer, ResidencyAffinityScorer, RunningSetScorer
from router.placement.types import Action, Decision, PlacementRequest, ReplicaView, Resident, Scores

_NEG = -math.inf  # total of a replica the filters drop
_INF = math.inf

_FILTER_TYPES = (HealthyFilter, ExcludeFilter, CanHostFilter)
# The scorers around the third, which prices evictions: eviction-cost (the default, with the
# cost-aware evictor) or free-slot (LRU age, with any other evictor).
_SCORER_TYPES = [ResidencyAffinityScorer, RunningSetScorer, LoadScorer]
_SLOT_TYPES = (FreeSlotScorer, EvictionCostScorer)
# Evictors that read only the chosen replica (``ctx.replicas[index]``, ``ctx.sums[index]``) and
# ``ctx.all_replicas``: the fast path hands them a one-candidate context. Others get the full one.
_CHOSEN_ONLY_EVICTORS: tuple[type[Evictor], ...] = (Evictor, LruIdleEvictor, HotCopyEvictor, CostAwareEvictor)


class _Row:
    """Request-independent facts of one view for one (weights, idle horizon) — see module doc."""

    __slots__ = ("b", "base", "d", "hi", "s", "sat", "t", "v")

    def __init__(
        self,
        v: ReplicaView,
        s: Summary | None,
        t: float,
        sat: float,
        b: float,
        d: float,
        base: float,
        hi: float = _INF,
    ) -> None:
        self.v = v
        self.s = s  # the view's summary (None for an unhealthy view: not needed)
        self.t = t  # total for an adapter not held there when sat <= now < hi; -inf: dropped
        self.sat = sat  # see t; -inf when the total does not depend on now
        self.hi = hi  # see t (eviction-cost rows: the end of the second t was computed for)
        self.b = b  # w1·0 + w2·room
        self.d = d  # w4·(1 − load)
        self.base = base  # total of a base-model request; -inf: dropped (unhealthy)


class _CandidateScores(Scores):
    """``Decision.scores`` of the fast path: url → total of the replicas whose total is finite
    (the candidates left by the filters), built into a dict only when read."""

    __slots__ = ("_views",)

    def __init__(self, views: Sequence[ReplicaView], totals: Sequence[float]) -> None:
        super().__init__((), totals)
        self._views = views

    def _dict(self) -> dict[str, float]:
        d = self._d
        if d is None:
            d = self._d = {v.url: t for v, t in zip(self._views, self._totals, strict=True) if t != _NEG}
        return d

    def __iter__(self) -> Iterator[str]:
        return iter(self._dict())

    def __len__(self) -> int:
        return len(self._dict())


def _threshold(x: float, h: float) -> float:
    """A ``now`` from which ``(now − x) / h >= 1`` holds (that predicate is monotone in ``now``):
    the first float at or above ``x + h`` where it does; +inf when none is found nearby."""
    t = x + h
    if not math.isfinite(t):
        return _INF
    for _ in range(64):
        if (t - x) / h >= 1.0:
            return t
        t = math.nextafter(t, _INF)
    return _INF


class DefaultProfile(SchedulerProfile):
    """The ``default`` profile with the fused fast path (see the module docstring)."""

    def __init__(
        self,
        name: str,
        filters: Sequence[Filter],
        scorers: Sequence[tuple[Scorer, float]],
        picker: Picker,
        evictor: Evictor | None = None,
    ) -> None:
        super().__init__(name, filters, scorers, picker, evictor)
        self.fused = True  # False: always the generic pipeline (comparisons, benchmarks)
        self._plan = self._make_plan()

    def _make_plan(self) -> tuple[object, ...] | None:
        """What the fast path relies on, or None when the pipeline is not the default one."""
        if tuple(type(f) for f in self.filters) != _FILTER_TYPES:
            return None
        kinds = [type(s) for s, _ in self.scorers]
        if len(kinds) != 4 or kinds[:2] + kinds[3:] != _SCORER_TYPES or kinds[2] not in _SLOT_TYPES:
            return None
        if type(self.picker) is not MaxScorePicker:
            return None
        if not all(math.isfinite(w) and w > 0.0 for w in self._weights):
            return None
        slot = self.scorers[2][0]
        w1, w2, w3, w4 = self._weights
        self._w = (w1, w2, w3, w4)
        if isinstance(slot, EvictionCostScorer):
            # Its score of a full replica changes with now (decay) and is computed at each pick
            # (the row's t holds it for now = +inf only).
            self._cost: EvictionCostScorer | None = slot
            self._h = math.inf
            self._key = f"fused-default:{w1!r}:{w2!r}:{w3!r}:{w4!r}:cost:{slot.scale!r}:{slot.top!r}"
            return (self.filters, self.scorers, self.picker, None)
        assert isinstance(slot, FreeSlotScorer)
        h = slot.idle_horizon_s
        if not (math.isfinite(h) and h > 0.0):
            return None
        self._cost = None
        self._h = h
        # One memo per (weights, horizon): profiles with the same parameters share it.
        self._key = f"fused-default:{w1!r}:{w2!r}:{w3!r}:{w4!r}:{h!r}"
        return (self.filters, self.scorers, self.picker, h)

    @property
    def affinity(self) -> ResidencyAffinityScorer:
        """The resident-affinity scorer (the first one of the fused pipeline)."""
        aff = self.scorers[0][0]
        assert isinstance(aff, ResidencyAffinityScorer)
        return aff

    def index_signature(self) -> tuple[object, ...]:
        """The parameters a placement index built for this profile depends on."""
        aff = self.affinity
        slot = self.scorers[2][0]
        extra: tuple[object, ...]
        if isinstance(slot, EvictionCostScorer):
            ev = slot.evictor
            extra = (slot.scale, slot.top, ev.half_life_s, ev.load_fixed_s, ev.load_bytes_per_s)
        else:
            assert isinstance(slot, FreeSlotScorer)
            extra = (slot.idle_horizon_s,)
        return (self._w, aff.high_water, aff.adapter_high, aff.low_water, type(self.evictor), *extra)

    def _planned(self) -> bool:
        plan = self._plan
        if plan is None or not self.fused:
            return False
        filters, scorers, picker, h = plan
        return (
            self.filters is filters
            and self.scorers is scorers
            and self.picker is picker
            and (h is None or self.scorers[2][0].idle_horizon_s == h)  # type: ignore[attr-defined]
        )

    # ------------------------------------------------------------------ per-view memo

    def _row(self, v: ReplicaView) -> _Row:
        w1, w2, w3, w4 = self._w
        if not v.healthy:
            r = _Row(v, None, _NEG, _NEG, 0.0, 0.0, _NEG)
        else:
            s = v.derived.get("summary") or summary(v)
            b = w1 * 0.0 + w2 * s.room
            d = w4 * (1.0 - s.load)
            base = w1 * 0.0 + w2 * 1.0 + w3 * 1.0 + d
            x = s.lru_last_used
            if not s.takes_new:
                r = _Row(v, s, _NEG, _NEG, b, d, base)
            elif s.free:
                r = _Row(v, s, b + w3 * 1.0 + d, _NEG, b, d, base)
            else:  # full but takes a new adapter by evicting: something is idle (x is not None)
                assert x is not None
                cost = self._cost
                if cost is None:
                    r = _Row(v, s, b + w3 * 0.6 + d, _threshold(x, self._h), b, d, base)
                else:  # valid for no now yet: the first pick prices it for its second
                    r = _Row(v, s, _NEG, _INF, b, d, base, _NEG)
        v.derived[self._key] = r
        return r

    def _free_slot(self, v: ReplicaView, s: Summary, now: float) -> float:
        """The third scorer's score of a replica for an adapter not present there
        (EvictionCostScorer or FreeSlotScorer)."""
        cost = self._cost
        if cost is not None:
            return cost.slot_score(v, s, now)
        if s.free:
            return 1.0
        x = s.lru_last_used
        if x is None:
            return 0.0
        f = (now - x) / self._h
        return 0.6 if f >= 1.0 else (0.1 + 0.5 * f if f > 0.0 else 0.1)

    def _slow(self, r: _Row, now: float) -> float:
        """A row's total when ``now`` is outside ``[r.sat, r.hi)`` (also when it is NaN): computed
        from ``now`` for a row whose third score depends on it (eviction-cost rows then hold the
        total for that second), else the row's constant total."""
        s = r.s
        if r.sat == _NEG or s is None:
            return r.t
        t = r.b + self._w[2] * self._free_slot(r.v, s, now) + r.d
        cost = self._cost
        if cost is not None and (q := cost.bucket(now)) is not None:
            r.t, r.sat, r.hi = t, q, q + 1.0  # eviction-cost: the same total for that second
        return t

    # ------------------------------------------------------------------ pick

    def pick(self, request: PlacementRequest, replicas: list[ReplicaView], now: float) -> Decision:
        if not replicas or not self._planned():
            return super().pick(request, replicas, now)
        key = self._key
        row = self._row
        name = request.lora_name
        if name is None:
            totals = [(v.derived.get(key) or row(v)).base for v in replicas]
        else:
            slow = self._slow
            totals = [
                r.t if (r := v.derived.get(key) or row(v)).sat <= now < r.hi else slow(r, now)
                for v in replicas
            ]
        ex = request.exclude
        if ex:
            for i, v in enumerate(replicas):
                if v.url in ex:
                    totals[i] = _NEG
        held: list[int] = []
        elsewhere = False
        if name is not None:
            held = [i for i, v in enumerate(replicas) if name in v.residents]
            if held:
                out = [_NEG] * len(held)
                hw = self.affinity.high_water
                elsewhere = score_holders(
                    self,
                    name,
                    ex,
                    [replicas[i] for i in held],
                    out,
                    now,
                    lambda: self._other_unsaturated(replicas, held, totals, hw),
                )
                for i, t in zip(held, out, strict=True):
                    totals[i] = t
        top = max(totals)
        if top == _NEG:  # no candidate: the generic path names the filter that emptied the list
            return super().pick(request, replicas, now)
        index = totals.index(top)
        floor = top - _EPS  # MaxScorePicker: ties within _EPS of the top → the first one wins
        if index and max(totals[:index]) >= floor:
            index = next(i for i, t in enumerate(totals) if t >= floor)
        return self._fused_decide(request, replicas, now, totals, index, elsewhere)

    def _other_unsaturated(
        self, replicas: list[ReplicaView], held: list[int], totals: list[float], hw: float
    ) -> bool:
        """Some candidate not holding the adapter is not saturated (then replicate)."""
        holders = set(held)
        key = self._key
        for i, t in enumerate(totals):
            if t == _NEG or i in holders:
                continue
            s = replicas[i].derived[key].s
            if not (s.load >= hw or s.full):
                return True
        return False

    def _fused_decide(
        self,
        request: PlacementRequest,
        replicas: list[ReplicaView],
        now: float,
        totals: list[float],
        index: int,
        elsewhere: bool,
    ) -> Decision:
        """``SchedulerProfile._decide`` for the fast path (index into ``replicas``)."""
        view = replicas[index]
        scores = _CandidateScores(tuple(replicas), totals)
        name = request.lora_name
        if name is None:
            return Decision(replica=view.url, action="hit", scores=scores, reason="base model")
        target = view.residents.get(name)
        if target is not None and target.state in PRESENT:
            return hit_decision(view, target, scores)
        action: Action = "replicate" if elsewhere else "load"
        s = view.derived[self._key].s
        need = s.occupied - view.max_adapters + 1
        victims = self._victims(request, replicas, now, totals, index, target, s, need) if need > 0 else ()
        return load_decision(view, action, victims, scores)

    def _victims(
        self,
        request: PlacementRequest,
        replicas: list[ReplicaView],
        now: float,
        totals: list[float],
        index: int,
        target: Resident | None,
        s: Summary,
        need: int,
    ) -> tuple[str, ...] | None:
        """The evictor's answer with the context the generic pipeline would give it."""
        if type(self.evictor) in _CHOSEN_ONLY_EVICTORS:
            ctx = PickContext.__new__(PickContext)
            ctx.request = request
            ctx.all_replicas = replicas
            ctx.replicas = [replicas[index]]
            ctx.now = now
            ctx.held = {0: target} if target is not None else {}
            ctx._sums = [s]
            ctx._maps = None
            return self.evictor.victims(ctx, 0, need)
        keep = [i for i, t in enumerate(totals) if t != _NEG]
        ctx = PickContext(request, replicas, now)
        if len(keep) != len(replicas):
            ctx.narrow(keep)
        return self.evictor.victims(ctx, keep.index(index), need)
