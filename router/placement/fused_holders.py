"""The totals of the replicas holding the requested adapter, as the default pipeline scores them.

Shared by the fused fast path (``fused.py``, every holder of the snapshot) and the placement
index (``index_pick.py``, when the adapter has few holders): resident-affinity needs all the
holders at once (saturation, demand, the primary copy), the other scorers are per replica.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from router.placement.framework import PRESENT
from router.placement.types import ReplicaView, Resident

if TYPE_CHECKING:
    from router.placement.fused import DefaultProfile, _Row

_NEG = float("-inf")


def score_holders(
    p: DefaultProfile,
    name: str,
    ex: frozenset[str],
    views: Sequence[ReplicaView],
    totals: list[float],
    now: float,
    other_unsaturated: Callable[[], bool],
) -> bool:
    """Set ``totals[j]`` for each view of ``views`` (the replicas holding ``name``, in snapshot
    order) exactly as the generic pipeline scores them (-inf where a filter drops one); return
    whether any of them has it ``resident`` (load vs replicate). ``other_unsaturated`` says
    whether some candidate not holding it is not saturated (asked only when every holder is)."""
    present = PRESENT
    key = p._key
    aff = p.affinity
    hw, ah = aff.high_water, aff.adapter_high
    w1, w2, w3, _ = p._w
    # w1·a for the affinities of the "spread" case (the usual one): saturated copies 0.3, the
    # others 1.0 (resident) / 0.9 (joining a load); w2·1.0 for an adapter in flight there.
    w_sat, w_res, w_join, w_run, w_c = w1 * 0.3, w1 * 1.0, w1 * 0.9, w2 * 1.0, w3 * 1.0
    elsewhere = False
    # Candidate holders (healthy, not excluded, and present there or able to take it), in
    # order, with resident-affinity's saturation (saturated_for(), as the scorer inlines it).
    # Totals are those of the spread case, fixed below in the others. The weighted sum keeps
    # _weighted_sum's order: ((w1·a + w2·b) + w3·c) + w4·d, with r.b = w1·0 + w2·room =
    # w2·room and r.d = w4·(1 − load) computed once per view.
    tg: dict[int, tuple[Resident, _Row]] = {}  # candidate holders where A is present
    free: list[int] = []
    saturated: list[int] = []
    demand = 0
    for i, v in enumerate(views):
        t = v.residents[name]
        st = t.state
        if st == "resident":
            elsewhere = True
        r = v.derived.get(key) or p._row(v)
        s = r.s
        if s is None or (ex and v.url in ex):  # unhealthy (no summary) or excluded
            totals[i] = _NEG
        elif st in present:
            f = t.inflight
            demand += f
            tg[i] = (t, r)
            if s.load >= hw or ((f / s.cap >= ah) if f else s.full):
                saturated.append(i)
                totals[i] = w_sat + (w_run if f > 0 else r.b) + w_c + r.d
            else:
                free.append(i)
                w = w_res if st == "resident" else w_join
                totals[i] = w + (w_run if f > 0 else r.b) + w_c + r.d
        elif s.takes_new:  # failed/unloading there: affinity 0, free-slot as for any replica
            b = 1.0 if t.inflight > 0 else s.room
            totals[i] = w1 * 0.0 + w2 * b + w3 * p._free_slot(v, s, now) + r.d
        else:
            totals[i] = _NEG
    if not tg:
        return elsewhere
    a: dict[int, float]  # affinities that differ from the spread case
    if not free:
        a = dict.fromkeys(saturated, 0.0)
        if not other_unsaturated():
            a = dict.fromkeys(saturated, 1.0)  # every replica saturated: stay
    elif len(free) + len(saturated) > 1 and demand / tg[free[0]][1].s.cap < aff.low_water:  # type: ignore[union-attr]
        # Consolidate on the primary copy: most in-flight, then most recently used.
        primary = max((tg[i][0].inflight, tg[i][0].last_used, -i) for i in free + saturated)
        q = -primary[2]
        a = dict.fromkeys(free, 0.6)
        if q in free:
            a[q] = 1.0 if tg[q][0].state == "resident" else 0.9
    else:
        return elsewhere
    for i, aa in a.items():
        t, r = tg[i]
        totals[i] = w1 * aa + (w_run if t.inflight > 0 else r.b) + w_c + r.d
    return elsewhere
