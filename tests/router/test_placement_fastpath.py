"""The default profile's fused fast path (router/placement/fused.py) decides exactly as the generic
pipeline (filters → weighted scorers → max-score picker → evictor, ``SchedulerProfile.pick``).

Random clusters cover: unhealthy replicas, ``exclude`` sets, base-model requests, adapters held in
every residency state, saturated replicas (load, per-adapter in-flight, full running sets), full
replicas needing one or several evictions, idle copies of hot adapters (HotCopyEvictor), hot-copy
targets with and without a strict prewarm (``PlacementRequest.hot_targets``), ties,
``now`` before and after the free-slot idle horizon, custom parameters and weights; snapshots are
rebuilt between picks as the router (and benchmarks/placement.py) does. The reference evictor
and summary below are the implementations the fast path replaced, kept verbatim.
"""

from __future__ import annotations

import math
import random
from dataclasses import replace
from typing import Any

import pytest

from benchmarks.placement import build_cluster, record
from router.placement import make_profile
from router.placement.evictors import CostAwareEvictor, EvictionCostScorer
from router.placement.framework import (
    OCCUPYING,
    Evictor,
    PickContext,
    SchedulerProfile,
    load_fraction,
    summary,
)
from router.placement.fused import DefaultProfile, _threshold
from router.placement.profiles import default_profile
from router.placement.types import Decision, PlacementRequest, ReplicaView, ResidencyState, Resident

STATES: tuple[ResidencyState, ...] = (
    "resident",
    "resident",
    "resident",
    "loading",
    "staging",
    "unloading",
    "failed",
)


class ReferenceHotCopyEvictor(Evictor):
    """HotCopyEvictor as it was before the fast path (per-candidate demand over all replicas),
    plus the hot-copy rules of ``PlacementRequest.hot_targets`` / ``strict_hot``, written out."""

    name = "reference-lru-idle-keep-hot"

    def __init__(self, low_water: float = 0.05, scan: int = 8) -> None:
        self.low_water = low_water
        self.scan = scan

    def victims(self, ctx: PickContext, index: int, need: int) -> tuple[str, ...] | None:
        view = ctx.replicas[index]
        idle = reference_idle_lru(view)
        if len(idle) < need:
            return None
        cap = view.max_num_seqs if view.max_num_seqs > 0 else 1
        cold: list[str] = []
        for r in idle[: self.scan]:
            name = r.lora_name
            demand = sum([o.inflight for v in ctx.all_replicas if (o := v.residents.get(name)) is not None])
            if not demand / cap >= self.low_water:
                cold.append(name)
        order = cold + [r.lora_name for r in idle if r.lora_name not in cold]
        # Hot copies (eviction as data): passed over while another candidate exists; when only
        # they are left, a strict (prewarm) request gets no room, any other takes them.
        free = [n for n in order if not reference_keeps_hot_copy(ctx, n)]
        if len(free) >= need:
            return tuple(free[:need])
        if ctx.request.strict_hot:
            return None
        return tuple(free + [n for n in order if n not in free][: need - len(free)])


def reference_keeps_hot_copy(ctx: PickContext, name: str) -> bool:
    want = ctx.request.hot_targets.get(name, 0)
    copies = [
        v
        for v in ctx.all_replicas
        if v.healthy and name in v.residents and v.residents[name].state != "failed"
    ]
    return want > 0 and len(copies) <= want


def reference_idle_lru(view: ReplicaView) -> tuple[Resident, ...]:
    idle = [r for r in view.residents.values() if not r.inflight > 0 and r.state == "resident"]
    idle.sort(key=lambda r: (r.last_used, r.lora_name))
    return tuple(idle)


def reference_summary(view: ReplicaView) -> dict[str, object]:
    """The summary() of before the fast path (eager sort), as a dict of its fields."""
    occupied = sum(1 for r in view.residents.values() if r.state in OCCUPYING)
    running = sum(1 for r in view.residents.values() if r.inflight > 0)
    idle = reference_idle_lru(view)
    m = view.max_loras
    return {
        "occupied": occupied,
        "running": running,
        "idle_lru": idle,
        "load": load_fraction(view),
        "free": occupied < view.max_adapters,
        "room": (0.7 + 0.2 * (1.0 - running / m)) if running < m else 0.4 / (1 + running - m),
        "lru_last_used": idle[0].last_used if idle else None,
        "full": running >= m,
        "takes_new": occupied < view.max_adapters or len(idle) >= occupied - view.max_adapters + 1,
        "cap": view.max_num_seqs if view.max_num_seqs > 0 else 1,
    }


def generic_of(p: DefaultProfile) -> SchedulerProfile:
    """The same pipeline as ``p`` run generically, with the reference evictor (the cost-aware
    evictor is not part of the fast path: it is shared as is)."""
    if isinstance(p.evictor, CostAwareEvictor):
        return SchedulerProfile(p.name, p.filters, p.scorers, p.picker, p.evictor)
    assert isinstance(p.evictor, Evictor)
    low_water = getattr(p.evictor, "low_water", 0.05)
    scan = getattr(p.evictor, "scan", 8)
    return SchedulerProfile(p.name, p.filters, p.scorers, p.picker, ReferenceHotCopyEvictor(low_water, scan))


def outcome(d: Decision) -> tuple[object, ...]:
    return (d.replica, d.action, d.evict, d.reason, dict(d.scores))


# ---------------------------------------------------------------- random clusters


def rand_resident(rng: random.Random, name: str, now: float, horizon: float) -> Resident:
    state = rng.choice(STATES)
    inflight = rng.choice((0, 0, 0, 1, 2, 5, 30)) if state in ("resident", "loading", "staging") else 0
    if rng.random() < 0.01:  # a count gone below zero (a runtime bug): decisions still identical
        inflight = -rng.randint(1, 40)
    # Few distinct last_used values: ties in the LRU order; some before, some after the horizon.
    last_used = rng.choice((now - 3 * horizon, now - horizon, now - horizon / 2, now - 1.0, now, 0.0))
    if rng.random() < 0.02:  # clock values far from now (rounding around the horizon), infinities
        last_used = rng.choice((now - horizon + 1e-12, 1e17, -1e17, math.inf, -math.inf))
    # Request counts and sizes vary the eviction-cost scorer's prices (and the evictor's order).
    requests = rng.choice((0, 1, 1, 2, 7, 40))
    size = rng.choice((1, 1, 32 << 20, 4 << 30))
    return Resident(name, name, state, last_used, inflight, size, requests)


def rand_view(rng: random.Random, i: int, names: list[str], now: float, horizon: float) -> ReplicaView:
    max_adapters = rng.randint(1, 6)
    k = rng.randint(0, max_adapters + 2)  # sometimes above max_adapters: evict more than one
    residents = {n: rand_resident(rng, n, now, horizon) for n in rng.sample(names, min(k, len(names)))}
    own = sum(r.inflight for r in residents.values())
    return ReplicaView(
        url=f"r{i}" if rng.random() < 0.95 else "r0",  # a duplicated url now and then
        pool="p",
        healthy=rng.random() < 0.85,
        max_loras=rng.randint(0, 4),
        max_adapters=max_adapters,
        residents=residents,
        inflight=own + rng.choice((0, 0, 1, 10, 60)),
        waiting=rng.choice((0, 0, 2, 30)),
        max_num_seqs=rng.choice((0, 1, 8, 64, 100)),
    )


def rand_request(rng: random.Random, names: list[str], urls: list[str]) -> PlacementRequest:
    name = None if rng.random() < 0.1 else rng.choice(names)
    exclude = (
        frozenset(rng.sample(urls, rng.randint(1, min(3, len(urls))))) if rng.random() < 0.2 else frozenset()
    )
    hot: dict[str, int] = {}
    if rng.random() < 0.3:  # hot-copy targets (eviction as data), sometimes a strict prewarm
        hot = {n: rng.randint(0, 3) for n in rng.sample(names, rng.randint(1, len(names)))}
    strict = bool(hot) and rng.random() < 0.3
    return PlacementRequest(
        lora_name=name, adapter_id=name, exclude=exclude, hot_targets=hot, strict_hot=strict
    )


def rand_profile(rng: random.Random) -> DefaultProfile:
    weights = rng.choice(
        (
            None,
            {"load": 2.0},
            {"resident-affinity": 1.0, "running-set": 0.5, "free-slot": 3.0, "load": 0.25},
            {"resident-affinity": 10.0},
            {"running-set": 1e-12},
            {"load": 1e-10, "free-slot": 3e-10},  # totals apart by less than the 1e-9 tie margin
        )
    )
    hw = rng.choice((0.75, 0.3, 0.95))
    evictor = rng.choice(("cost-aware-keep-hot", "lru-idle-keep-hot"))  # eviction-cost / free-slot
    if weights is not None and evictor == "cost-aware-keep-hot" and "free-slot" in weights:
        weights = {("eviction-cost" if k == "free-slot" else k): v for k, v in weights.items()}
    p = default_profile(
        evictor=evictor,
        weights=weights,
        high_water=hw,
        adapter_high=rng.choice((0.25, 0.05, 0.9)),
        low_water=rng.choice((0.05, 0.0, 0.2, hw)),
        idle_horizon_s=rng.choice((60.0, 1.0, 7.5)),
    )
    assert isinstance(p, DefaultProfile) and p._planned()
    return p


def rebuilt(
    rng: random.Random, views: list[ReplicaView], d: Decision, req: PlacementRequest, now: float
) -> None:
    """The runtime's next snapshot: the chosen replica with the request recorded, a finished
    request elsewhere, a health flip now and then (each as a new view object)."""
    if d.replica is not None and req.lora_name is not None:
        i = next(k for k, v in enumerate(views) if v.url == d.replica)
        v = views[i]
        residents = {n: r for n, r in v.residents.items() if n not in d.evict}
        old = residents.get(req.lora_name)
        state: ResidencyState = old.state if old is not None and old.state != "failed" else "loading"
        residents[req.lora_name] = Resident(
            req.lora_name, req.lora_name, state, now, (old.inflight if old else 0) + 1
        )
        views[i] = replace(v, residents=residents, inflight=v.inflight + 1)
    j = rng.randrange(len(views))
    v = views[j]
    busy = [r for r in v.residents.values() if r.inflight]
    if busy:
        r = rng.choice(busy)
        residents = dict(v.residents)
        residents[r.lora_name] = replace(r, inflight=r.inflight - 1, state=rng.choice(("resident", r.state)))
        views[j] = replace(v, residents=residents, inflight=max(0, v.inflight - 1))
    if rng.random() < 0.1:
        k = rng.randrange(len(views))
        views[k] = replace(views[k], healthy=not views[k].healthy)


def check_sequence(seed: int, picks: int) -> tuple[int, int, int]:
    """Run ``picks`` decisions on one evolving random cluster; return how many were compared,
    how many evicted under hot-copy targets, and how many strict prewarms got no room."""
    rng = random.Random(seed)
    names = [f"a{k}" for k in range(rng.randint(2, 14))]
    now = rng.choice((0.0, 100.0, 5000.0))
    fused = rand_profile(rng)
    generic = generic_of(fused)
    horizon = fused._h if math.isfinite(fused._h) else 120.0  # eviction-cost: its half-life
    views = [rand_view(rng, i, names, now, horizon) for i in range(rng.randint(1, 24))]
    if rng.random() < 0.3:  # identical replicas: exact ties in the totals
        views = views + [replace(v, url=f"{v.url}-twin") for v in views[: rng.randint(1, len(views))]]
    hot_evictions = no_room = 0
    for _ in range(picks):
        req = rand_request(rng, [*names, "absent"], [v.url for v in views])
        # The generic pipeline runs on copies (its own memo), the fused path on the originals.
        copies = [replace(v) for v in views]
        want = generic.pick(req, copies, now)
        got = fused.pick(req, views, now)
        assert outcome(got) == outcome(want), (seed, req, now)
        if rng.random() < 0.2:  # and the generic pipeline of the very same instance
            assert outcome(SchedulerProfile.pick(fused, req, views, now)) == outcome(want), (seed, req)
        hot_evictions += bool(req.hot_targets and got.evict)
        no_room += req.strict_hot and got.replica is None and "max_adapters" in got.reason
        rebuilt(rng, views, got, req, now)
        now += rng.choice((0.0, 0.5, horizon / 3, horizon))
    return picks, hot_evictions, no_room


def test_fused_default_matches_generic_pipeline_on_random_clusters() -> None:
    counts = [check_sequence(seed, 12) for seed in range(1000)]
    assert sum(c[0] for c in counts) == 12000
    assert sum(c[1] for c in counts) > 40 and sum(c[2] for c in counts) > 2  # hot paths exercised


def test_fused_default_matches_generic_on_the_benchmark_workload() -> None:
    """benchmarks/placement.py's cluster and stream (smaller): hot adapters on many replicas,
    full replicas evicting, hot copies kept by HotCopyEvictor; views rebuilt between picks."""
    rng = random.Random(7)
    views, names, weights = build_cluster(rng, 40, 2000, 32, 8)
    copies = [replace(v) for v in views]
    fused = make_profile("default")
    assert isinstance(fused, DefaultProfile) and fused._planned()
    generic = generic_of(fused)
    index = {v.url: i for i, v in enumerate(views)}
    now = 1000.0
    evictions = replications = 0
    for k, lora in enumerate(rng.choices(names, weights=weights, k=3000)):
        req = PlacementRequest(lora_name=lora, adapter_id=lora, size_bytes=64 << 20, max_tokens=256)
        want = generic.pick(req, copies, now)
        got = fused.pick(req, views, now)
        assert outcome(got) == outcome(want), k
        evictions += bool(got.evict)
        replications += got.action == "replicate"
        now += 0.01
        if got.replica is None:
            continue
        for j in record(views, index[got.replica], got.evict, lora, now, k, rng, 8, 32):
            copies[j] = replace(views[j])
    assert evictions > 300 and replications > 10  # the paths that matter were exercised


def _fused(**kw: Any) -> DefaultProfile:
    p = default_profile(**kw)
    assert isinstance(p, DefaultProfile)
    return p


def test_profiles_outside_the_fast_path_use_the_generic_pipeline() -> None:
    # A weight of 0 drops its scorer: not the fused pipeline any more.
    p = _fused(weights={"eviction-cost": 0})
    assert not p._planned()
    assert [s.name for s, _ in p.scorers] == ["resident-affinity", "running-set", "load"]
    p = _fused(weights={"free-slot": 0}, evictor="lru-idle-keep-hot")
    assert not p._planned()
    assert [s.name for s, _ in p.scorers] == ["resident-affinity", "running-set", "load"]
    p = _fused(weights={"free-slot": 0})  # not in the default pipeline: no effect
    assert p._planned() and isinstance(p.scorers[2][0], EvictionCostScorer)
    p = _fused(weights={"load": math.inf})
    assert not p._planned()
    # Replacing a plugin after construction is noticed (identity of the plugin tuples).
    p = _fused()
    p.scorers = p.scorers[:3]
    assert not p._planned()
    p = _fused()
    p.fused = False
    assert not p._planned()
    rng = random.Random(3)
    names = ["a", "b", "c"]
    for _ in range(200):
        views = [rand_view(rng, i, names, 50.0, 60.0) for i in range(6)]
        req = rand_request(rng, names, [v.url for v in views])
        q = default_profile(weights={"eviction-cost": 0})
        assert outcome(q.pick(req, views, 50.0)) == outcome(SchedulerProfile.pick(q, req, views, 50.0))


class YoungestIdleEvictor(Evictor):
    """Evicts the most recently used idle adapters and looks at every candidate (so the fast path
    must hand it the generic pipeline's full context)."""

    name = "youngest-idle"

    def victims(self, ctx: PickContext, index: int, need: int) -> tuple[str, ...] | None:
        assert all(v.healthy for v in ctx.replicas)
        idle = ctx.sums[index].idle_lru
        if len(idle) < need:
            return None
        if len(ctx.replicas) % 2:  # depends on the number of candidates
            return tuple(r.lora_name for r in idle[:need])
        return tuple(r.lora_name for r in reversed(idle[-need:]))


def test_other_evictors_get_the_generic_context() -> None:
    base = default_profile()
    for evictor in (YoungestIdleEvictor(), Evictor()):
        p = DefaultProfile("default", base.filters, base.scorers, base.picker, evictor)
        assert p._planned()
        for seed in range(150):
            rng = random.Random(seed)
            names = [f"a{k}" for k in range(6)]
            views = [rand_view(rng, i, names, 100.0, 60.0) for i in range(rng.randint(1, 10))]
            req = rand_request(rng, names, [v.url for v in views])
            got = p.pick(req, views, 100.0)
            want = SchedulerProfile.pick(p, req, [replace(v) for v in views], 100.0)
            assert outcome(got) == outcome(want)


def test_threshold_is_where_the_idle_horizon_is_reached() -> None:
    rng = random.Random(5)
    for _ in range(20000):
        x = rng.choice((rng.uniform(-1e6, 1e6), rng.uniform(0, 1e12), float(rng.randint(0, 10**6))))
        h = rng.choice((60.0, 7.5, 1 / 3, 1e-3, rng.uniform(1e-6, 1e4)))
        t = _threshold(x, h)
        assert (t - x) / h >= 1.0  # from t on (monotone in now) the free-slot score is the constant
        assert t < x + 2 * h


def test_fused_default_matches_generic_around_the_idle_horizon() -> None:
    """``now`` a few ulps either side of last_used + idle_horizon_s, on full replicas whose LRU
    idle adapter sets the free-slot score, for adapters absent, failed or unloading there."""
    rng = random.Random(9)
    for _ in range(400):
        h = rng.choice((60.0, 7.5, 1 / 3, 1e-3))
        p = default_profile(
            idle_horizon_s=h, weights=rng.choice((None, {"free-slot": 7.0})), evictor="lru-idle-keep-hot"
        )
        xs = [rng.uniform(0, 1e6) for _ in range(3)]
        views = []
        for i, x in enumerate(xs):
            residents = {
                "idle": Resident("idle", "idle", "resident", x, 0),
                "busy": Resident("busy", "busy", "resident", x, 1),
                "a": Resident("a", "a", rng.choice(("failed", "unloading", "resident")), x, 0),
            }
            if rng.random() < 0.5:
                del residents["a"]
            views.append(ReplicaView(f"r{i}", "p", True, 4, len(residents), residents, inflight=1))
        now = rng.choice(xs) + h
        for _ in range(rng.randint(0, 3)):
            now = math.nextafter(now, rng.choice((math.inf, -math.inf)))
        req = PlacementRequest(rng.choice(("a", "b")), None)
        got = p.pick(req, views, now)
        want = SchedulerProfile.pick(p, req, [replace(v) for v in views], now)
        assert outcome(got) == outcome(want)


def test_no_candidate_reasons_match_the_generic_pipeline() -> None:
    p = make_profile("default")
    assert isinstance(p, DefaultProfile)
    full = Resident("x", "x", "resident", 0.0, 1)
    busy = ReplicaView("r0", "p", True, 2, 1, {"x": full}, inflight=1)
    sick = ReplicaView("r1", "p", False, 2, 1, {})
    for req, reps in (
        (PlacementRequest("a", "a"), []),
        (PlacementRequest("a", "a"), [sick]),
        (PlacementRequest("a", "a", exclude=frozenset({"r0"})), [busy, sick]),
        (PlacementRequest("a", "a"), [busy]),
        (PlacementRequest(None, None, exclude=frozenset({"r0"})), [busy]),
    ):
        got, want = p.pick(req, reps, 1.0), SchedulerProfile.pick(p, req, reps, 1.0)
        assert got.replica is None and outcome(got) == outcome(want)


def test_now_nan_and_inf_match_the_generic_pipeline() -> None:
    rng = random.Random(11)
    names = ["a", "b", "c", "d"]
    p = make_profile("default")
    for _ in range(300):
        views = [rand_view(rng, i, names, 100.0, 60.0) for i in range(8)]
        req = rand_request(rng, names, [v.url for v in views])
        for now in (math.nan, math.inf, -math.inf):
            got = p.pick(req, views, now)
            want = SchedulerProfile.pick(p, req, [replace(v) for v in views], now)
            assert outcome(got) == outcome(want)


@pytest.mark.parametrize("seed", range(4))
def test_summary_matches_the_reference(seed: int) -> None:
    rng = random.Random(seed)
    names = [f"a{k}" for k in range(10)]
    for _ in range(300):
        v = rand_view(rng, 0, names, 100.0, 60.0)
        s = summary(v)
        ref = reference_summary(v)
        assert {k: getattr(s, k) for k in ref} == ref


def test_summary_lru_with_nan_last_used_keeps_the_sorted_order() -> None:
    residents = {
        n: Resident(n, n, "resident", t, 0) for n, t in (("x", 5.0), ("y", math.nan), ("z", 3.0), ("w", 9.0))
    }
    v = ReplicaView("r", "p", True, 2, 8, residents)
    got, want = summary(v).lru_last_used, reference_summary(v)["lru_last_used"]
    assert isinstance(got, float) and isinstance(want, float)
    assert got == want or (math.isnan(got) and math.isnan(want))
    assert summary(v).idle_lru == reference_idle_lru(v)
