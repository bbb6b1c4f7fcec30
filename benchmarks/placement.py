"""Placement decision-time benchmark: 10,000 adapters, 100 replicas, every profile.

Each replica holds ``max_adapters`` residents (realistic residency: popular adapters on several
replicas, the tail spread), some with requests in flight, and scraped gauges. Requests are drawn
from a power-law popularity over all adapters, so both hits and loads (with eviction) occur.

Times are CPU time of the benchmark thread (``time.thread_time_ns``), and each profile runs
``--repeat`` identical passes (same seed, same decisions) keeping, per decision, the fastest
pass: on a shared machine this removes other processes' noise; the first pass's raw p99 is
reported too.

Between decisions the chosen replica's snapshot is rebuilt with the request accounted (as the
router runtime does when it forwards one), outside the timed region; so the next decision on
it pays for re-deriving that replica's summary, as it would in production. Only
``profile.pick`` is timed.

    python -m benchmarks.placement [--decisions 20000] [--replicas 100] [--adapters 10000]

Prints p50/p99 per decision for each profile and writes ``benchmarks/results/placement.json``.
Target: p99 < 100 µs for the default profile.
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import sys
import time
from pathlib import Path
from typing import Any

from router.placement import BASELINES, PROFILES, PlacementRequest, ReplicaView, Resident, make_profile

RESULTS = Path(__file__).resolve().parent / "results"


def build_cluster(
    rng: random.Random, n_replicas: int, n_adapters: int, max_adapters: int, max_loras: int
) -> tuple[list[ReplicaView], list[str], list[float]]:
    names = [f"lora-{i:05d}" for i in range(n_adapters)]
    weights = [1.0 / (i + 1) for i in range(n_adapters)]
    views = []
    for r in range(n_replicas):
        chosen: set[str] = set()
        # Half popular (sampled by weight, so hot adapters sit on many replicas), half tail.
        for name in rng.choices(names, weights=weights, k=max_adapters * 2):
            if len(chosen) >= max_adapters // 2:
                break
            chosen.add(name)
        while len(chosen) < max_adapters:
            chosen.add(names[rng.randrange(n_adapters)])
        residents = {}
        running = 0
        for name in chosen:
            busy = running < max_loras and rng.random() < 0.2
            running += busy
            residents[name] = Resident(
                lora_name=name,
                adapter_id=name,
                state="resident",
                last_used=rng.uniform(0.0, 1000.0),
                inflight=rng.randint(1, 12) if busy else 0,
            )
        inflight = sum(x.inflight for x in residents.values())
        views.append(_view(r, residents, inflight, rng, max_loras, max_adapters))
    return views, names, weights


def _view(
    r: int,
    residents: dict[str, Resident],
    inflight: int,
    rng: random.Random,
    max_loras: int,
    max_adapters: int,
) -> ReplicaView:
    info = tuple(n for n, x in residents.items() if x.inflight)
    return ReplicaView(
        url=f"http://replica-{r:03d}:8000",
        pool="bench",
        healthy=rng.random() > 0.02,
        max_loras=max_loras,
        max_adapters=max_adapters,
        residents=residents,
        inflight=inflight,
        running=inflight,
        waiting=rng.randint(0, 4),
        kv_cache_usage=rng.random() * 0.6,
        lora_running=info,
        lora_waiting=info,
    )


def run_stream(
    name: str, decisions: int, seed: int, n_replicas: int, n_adapters: int, max_adapters: int, max_loras: int
) -> tuple[list[int], dict[str, int]]:
    """One pass of ``decisions`` picks; returns the CPU ns of each pick and the action counts."""
    rng = random.Random(seed)
    views, names, weights = build_cluster(rng, n_replicas, n_adapters, max_adapters, max_loras)
    index = {v.url: i for i, v in enumerate(views)}
    profile = make_profile(name, seed=seed) if name in ("random", "gie-lora-affinity") else make_profile(name)
    stream = rng.choices(names, weights=weights, k=decisions)
    times: list[int] = []
    actions: dict[str, int] = {}
    now = 1000.0
    clock = time.thread_time_ns  # CPU time of this thread: not inflated by other processes
    gc.disable()
    try:
        for k, lora in enumerate(stream):
            req = PlacementRequest(lora_name=lora, adapter_id=lora, size_bytes=64 << 20, max_tokens=256)
            t0 = clock()
            d = profile.pick(req, views, now)
            times.append(clock() - t0)
            actions[d.action] = actions.get(d.action, 0) + 1
            now += 0.01
            if d.replica is None:
                continue
            record(views, index[d.replica], d.evict, lora, now, k, rng, max_loras, max_adapters)
    finally:
        gc.enable()
    return times, actions


def record(
    views: list[ReplicaView],
    i: int,
    evict: tuple[str, ...],
    lora: str,
    now: float,
    k: int,
    rng: random.Random,
    max_loras: int,
    max_adapters: int,
) -> list[int]:
    """After pick ``k`` placed ``lora`` on ``views[i]``: replace the views that change (new
    objects, as the runtime's snapshots are) and return their indices."""
    # The runtime records the request (and any eviction/load) in a new snapshot.
    v = views[i]
    residents = dict(v.residents)
    for victim in evict:
        residents.pop(victim, None)
    old = residents.get(lora)
    residents[lora] = Resident(lora, lora, "resident", now, (old.inflight if old else 0) + 1)
    views[i] = _view(i, residents, v.inflight + 1, rng, max_loras, max_adapters)
    # Keep the cluster in a steady state: every other pick, a request finishes somewhere.
    done_i = rng.randrange(len(views))
    if k % 2 == 0:
        dv = views[done_i]
        busy = [x for x in dv.residents.values() if x.inflight]
        if busy:
            x = rng.choice(busy)
            res2 = dict(dv.residents)
            res2[x.lora_name] = Resident(x.lora_name, x.adapter_id, x.state, x.last_used, x.inflight - 1)
            views[done_i] = _view(done_i, res2, max(0, dv.inflight - 1), rng, max_loras, max_adapters)
            return [i, done_i]
    return [i]


def run_router_path(
    name: str, decisions: int, seed: int, n_replicas: int, n_adapters: int, max_adapters: int, max_loras: int
) -> tuple[list[int], dict[str, int]]:
    """Like :func:`run_stream`, but as the router runtime decides: the views are taken from the
    router's mutable ``ReplicaState``s (``[r.view() for r in replicas]``, cached per replica until
    it changes) and the request is recorded on the state (in-flight, last use, loads and
    evictions), so the timed region is view building + ``profile.pick``."""
    from router.settings import PoolConfig
    from router.store import ReplicaState, Residency
    from router.store import views as router_views

    rng = random.Random(seed)
    views, names, weights = build_cluster(rng, n_replicas, n_adapters, max_adapters, max_loras)
    pool = PoolConfig(name="bench", max_loras=max_loras, max_adapters=max_adapters)
    states: list[ReplicaState] = []
    for v in views:
        st = ReplicaState(url=v.url, pool=pool, driver=None, healthy=v.healthy)  # type: ignore[arg-type]
        for x in v.residents.values():
            st.residents[x.lora_name] = Residency(
                x.lora_name, x.adapter_id, "v1", x.state, 0.0, x.last_used, x.inflight
            )
        st.inflight = v.inflight
        states.append(st)
    index = {st.url: i for i, st in enumerate(states)}
    profile = make_profile(name, seed=seed) if name in ("random", "gie-lora-affinity") else make_profile(name)
    stream = rng.choices(names, weights=weights, k=decisions)
    times: list[int] = []
    actions: dict[str, int] = {}
    now = 1000.0
    clock = time.thread_time_ns
    gc.disable()
    try:
        for k, lora in enumerate(stream):
            req = PlacementRequest(lora_name=lora, adapter_id=lora, size_bytes=64 << 20, max_tokens=256)
            t0 = clock()
            d = profile.pick(req, router_views(states), now)
            times.append(clock() - t0)
            actions[d.action] = actions.get(d.action, 0) + 1
            now += 0.01
            if d.replica is None:
                continue
            st = states[index[d.replica]]
            for victim in d.evict:
                st.residents.pop(victim, None)
            r = st.residents.get(lora)
            if r is None:
                st.residents[lora] = Residency(lora, lora, "v1", "resident", now, now, 1)
            else:
                r.inflight += 1
                r.last_used = now
            st.inflight += 1
            if k % 2 == 0:  # a request finishes somewhere
                done = states[rng.randrange(len(states))]
                busy = [x for x in done.residents.values() if x.inflight]
                if busy:
                    rng.choice(busy).inflight -= 1
                    done.inflight = max(0, done.inflight - 1)
    finally:
        gc.enable()
    return times, actions


def bench_profile(
    name: str,
    decisions: int,
    seed: int,
    n_replicas: int,
    n_adapters: int,
    max_adapters: int,
    max_loras: int,
    repeat: int,
    router_path: bool = False,
) -> dict[str, Any]:
    """``repeat`` identical passes (same seed → same decisions); per decision, the fastest pass
    counts, which filters out this machine's noise (other processes, cache thrash)."""
    best: list[int] | None = None
    first: list[int] = []
    actions: dict[str, int] = {}
    run = run_router_path if router_path else run_stream
    for r in range(repeat):
        times, acts = run(name, decisions, seed, n_replicas, n_adapters, max_adapters, max_loras)
        if r == 0:
            first, actions = list(times), acts
            best = times
        else:
            assert acts == actions, "passes must be identical"
            best = [min(a, b) for a, b in zip(best or times, times, strict=True)]
    assert best is not None
    vals = sorted(t / 1000.0 for t in best)
    raw = sorted(t / 1000.0 for t in first)

    def q(xs: list[float], p: float) -> float:
        return xs[min(len(xs) - 1, int(p * len(xs)))]

    return {
        "profile": f"{name} (router path)" if router_path else name,
        "decisions": decisions,
        "p50_us": q(vals, 0.50),
        "p90_us": q(vals, 0.90),
        "p99_us": q(vals, 0.99),
        "max_us": vals[-1],
        "mean_us": sum(vals) / len(vals),
        "raw_first_pass_p50_us": q(raw, 0.50),
        "raw_first_pass_p99_us": q(raw, 0.99),
        "actions": actions,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--decisions", type=int, default=20_000)
    ap.add_argument("--replicas", type=int, default=100)
    ap.add_argument("--adapters", type=int, default=10_000)
    ap.add_argument("--max-adapters", type=int, default=32)
    ap.add_argument("--max-loras", type=int, default=8)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--repeat", type=int, default=3, help="identical passes; the fastest per decision counts")
    ap.add_argument("--profiles", default=",".join(("default", *BASELINES)))
    ap.add_argument("--out", type=Path, default=RESULTS / "placement.json")
    a = ap.parse_args(argv)
    names = [p for p in a.profiles.split(",") if p]
    unknown = [p for p in names if p not in PROFILES]
    if unknown:
        ap.error(f"unknown profiles: {unknown}")
    print(
        f"placement decision time: {a.adapters} adapters, {a.replicas} replicas, "
        f"max_adapters={a.max_adapters}, max_loras={a.max_loras}, {a.decisions} decisions per profile"
    )
    print(
        f"  {'profile':<18} {'p50 µs':>8} {'p90 µs':>8} {'p99 µs':>8} {'max µs':>8} {'raw p99':>8}  actions"
    )
    runs = [(name, False) for name in names]
    if "default" in names:
        # The same decisions as the router runtime makes them: views taken from its replica state.
        runs.append(("default", True))
    rows = []
    for name, router_path in runs:
        r = bench_profile(
            name, a.decisions, a.seed, a.replicas, a.adapters, a.max_adapters, a.max_loras, a.repeat,
            router_path=router_path,
        )  # fmt: skip
        rows.append(r)
        acts = ", ".join(f"{k}={v}" for k, v in sorted(r["actions"].items()))
        cols = f"{r['p50_us']:>8.1f} {r['p90_us']:>8.1f} {r['p99_us']:>8.1f} {r['max_us']:>8.0f}"
        print(f"  {r['profile']:<18} {cols} {r['raw_first_pass_p99_us']:>8.1f}  {acts}", flush=True)
    default = next((r for r in rows if r["profile"] == "default"), None)
    routed = next((r for r in rows if r["profile"] == "default (router path)"), None)
    report = {
        "config": {k: v for k, v in vars(a).items() if k != "out"},
        "python": sys.version.split()[0],
        "results": rows,
        "target_p99_us": 100.0,
        "default_meets_target": bool(default and default["p99_us"] < 100.0),
        "router_path_meets_target": bool(routed and routed["p99_us"] < 100.0),
    }
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(report, indent=1))
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
