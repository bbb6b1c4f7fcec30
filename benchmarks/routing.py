"""Routing benchmark: replay a trace through each placement profile against simulated replicas.

The replay (``benchmarks/replay.py``) runs every replica's ``simulator.engine.EngineModel`` in
virtual time with the router side modelled as loraplane's runtime does it (residency records,
in-flight counts, singleflight loads, ``Decision.evict`` executed as is, scraped gauges), so a
10-minute trace replays in seconds and loads counts do not depend on the machine's load.

Per trace it also prints the offline lower bound on loads (``benchmarks/bounds.py``): the
compulsory loads (distinct adapters) and Belady's MIN on one cache of replicas × max_adapters
items, which no policy can beat, and each profile's loads as a multiple of MIN (``xMIN``).

Usage::

    python -m benchmarks.routing                       # both scenarios, seeds 0,1,2, all profiles
    python -m benchmarks.routing --trace my.jsonl      # a trace file instead of the generator
    python -m benchmarks.routing --duration 120 --seeds 0

Prints a table per scenario and profile and writes ``benchmarks/results/routing.json``.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections import defaultdict
from dataclasses import asdict
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make the repository root importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.bounds import bounds
from benchmarks.replay import ClusterConfig, RunResult, replay
from benchmarks.traces import TraceRequest, TraceSpec, generate, read_trace
from router.placement import BASELINES, make_profile

__all__ = ["PROFILES", "ClusterConfig", "RunResult", "main", "replay"]

PROFILES = ("default", *BASELINES)
# Extra rows: [label, profile, params]. default-lru: the default profile as it was before the
# cost-aware evictor and eviction-cost scorer (LRU idle eviction, free-slot scorer).
VARIANTS = [["default-lru", "default", {"evictor": "lru-idle-keep-hot"}]]
RESULTS = Path(__file__).resolve().parent / "results"


SCENARIOS = {
    "skewed": {"alpha": 1.0},
    "uniform": {"alpha": 0.1},
}


def _row(r: RunResult) -> str:
    return (
        f"  {r.profile:<18} {r.loads:>6} {r.loads_vs_min:>6.2f} {r.replications:>5} "
        f"{r.ttft_p50_s * 1000:>9.0f} {r.ttft_p99_s * 1000:>9.0f} {r.worst_adapter_p99_s * 1000:>10.0f} "
        f"{r.throughput_rps:>7.2f} {r.throughput_tok_s:>8.0f} {r.failed:>5} {r.wall_s:>6.1f}"
    )


HEADER = (
    f"  {'profile':<18} {'loads':>6} {'xMIN':>6} {'repl':>5} {'ttft_p50':>9} {'ttft_p99':>9} "
    f"{'worst_p99':>10} {'req/s':>7} {'tok/s':>8} {'fail':>5} {'wall':>6}\n"
    f"  {'':<18} {'':>6} {'':>6} {'':>5} {'(ms)':>9} {'(ms)':>9} {'(ms)':>10}"
)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trace", type=Path, help="JSON-lines trace file (instead of the generator)")
    ap.add_argument("--scenarios", default="skewed,uniform", help="generator scenarios to run")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--adapters", type=int, default=500)
    ap.add_argument("--rate", type=float, default=4.0, help="requests per second")
    ap.add_argument("--cv", type=float, default=1.0, help="burstiness (CV of inter-arrivals)")
    ap.add_argument("--duration", type=float, default=600.0, help="trace length in seconds")
    ap.add_argument("--replicas", type=int, default=4)
    ap.add_argument("--max-loras", type=int, default=4)
    ap.add_argument("--max-adapters", type=int, default=16)
    ap.add_argument("--adapter-mb", type=float, default=32.0)
    ap.add_argument("--load-overhead", type=float, default=0.1, help="router-side seconds per load")
    ap.add_argument("--scrape-interval", type=float, default=0.05)
    ap.add_argument("--profiles", default=",".join(PROFILES))
    ap.add_argument(
        "--params", default="{}", help='JSON params for the default profile, e.g. {"high_water":0.6}'
    )
    ap.add_argument(
        "--variants",
        default=json.dumps(VARIANTS),
        help='JSON list of extra rows [label, profile, params] ("[]" for none)',
    )
    ap.add_argument("--out", type=Path, default=RESULTS / "routing.json")
    a = ap.parse_args(argv)

    cfg = ClusterConfig(
        replicas=a.replicas,
        max_loras=a.max_loras,
        max_adapters=a.max_adapters,
        adapter_bytes=int(a.adapter_mb * 1024 * 1024),
        load_overhead_s=a.load_overhead,
        scrape_interval_s=a.scrape_interval,
    )
    default_params = json.loads(a.params)
    profiles = [p for p in a.profiles.split(",") if p]
    variants = [(str(label), str(name), dict(params)) for label, name, params in json.loads(a.variants)]
    runs: list[tuple[str, int | None, dict[str, Any], list[TraceRequest]]] = []
    if a.trace:
        runs.append((a.trace.name, None, {"file": str(a.trace)}, read_trace(a.trace)))
    else:
        for scen in [s for s in a.scenarios.split(",") if s]:
            for seed in [int(s) for s in a.seeds.split(",") if s]:
                spec = TraceSpec(
                    n_adapters=a.adapters,
                    alpha=SCENARIOS[scen]["alpha"],
                    rate=a.rate,
                    cv=a.cv,
                    duration_s=a.duration,
                    seed=seed,
                )
                runs.append((scen, seed, asdict(spec), generate(spec)))

    report: dict[str, Any] = {
        "cluster": asdict(cfg),
        "default_params": default_params,
        "variants": variants,
        "runs": [],
    }
    for scen, seed_or_none, spec_d, trace in runs:
        seed = seed_or_none or 0
        title = f"{scen}" + (f" seed={seed}" if seed_or_none is not None else "")
        bound = bounds([r.adapter for r in trace], cfg.replicas * cfg.max_adapters)
        print(f"\n== {title}: {len(trace)} requests, {spec_d}")
        print(
            f"  lower bound on loads: {bound['compulsory']} compulsory, {bound['belady_min']} Belady MIN "
            f"(one cache of {bound['capacity']}); online on that cache: LRU {bound['lru_one_cache']}, "
            f"LFU {bound['lfu_one_cache']}"
        )
        print(HEADER)
        results = []
        rows = [(name, name, default_params if name == "default" else {}) for name in profiles] + variants
        for label, name, params in rows:
            if name in ("random", "gie-lora-affinity"):
                params = {**params, "seed": seed}
            r = replay(trace, make_profile(name, **params), cfg)
            r.profile = label
            r.loads_vs_min = r.loads / bound["belady_min"] if bound["belady_min"] else math.nan
            results.append(r)
            print(_row(r), flush=True)
        refused = [r.profile for r in results if r.decisions.get("no-capacity")]
        if refused:  # retried requests are served out of trace order, which the bound assumes
            print(f"  note: {', '.join(refused)} refused requests (retried later): xMIN is approximate there")
        report["runs"].append(
            {
                "scenario": scen,
                "seed": seed_or_none,
                "trace": spec_d,
                "bound": bound,
                "results": [asdict(r) for r in results],
            }
        )
    report["summary"] = _summary(report["runs"])
    print("\n== default vs baselines (wins on p99 TTFT and loads per run)")
    for line in report["summary"]["lines"]:
        print("  " + line)
    for label, lead in report["summary"]["p99_lead"].items():
        print(f"  {label}: lowest p99 TTFT in every run: {'yes' if lead else 'no'}")
    print("\n== loads / Belady MIN per profile (min–max over the runs)")
    for line in report["summary"]["vs_min"]:
        print("  " + line)
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(report, indent=1))
    print(f"\nwrote {a.out}")
    return 0


def _summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    lines = []
    all_win = True
    for run in runs:
        res = {r["profile"]: r for r in run["results"]}
        d = res.get("default")
        if d is None:
            continue
        for name, r in res.items():
            if name not in BASELINES:
                continue
            p99 = d["ttft_p99_s"] < r["ttft_p99_s"]
            ld = d["loads"] < r["loads"]
            all_win &= p99 and ld
            dp, rp = d["ttft_p99_s"] * 1000, r["ttft_p99_s"] * 1000
            lines.append(
                f"{run['scenario']:<8} seed={run['seed']}  vs {name:<18} p99 {'WIN ' if p99 else 'LOSS'} "
                f"({dp:.0f} vs {rp:.0f} ms)  loads {'WIN ' if ld else 'LOSS'} ({d['loads']} vs {r['loads']})"
            )
    ratios: dict[str, list[float]] = defaultdict(list)
    for run in runs:
        for r in run["results"]:
            ratios[f"{run['scenario']:<8} {r['profile']:<18}"].append(r["loads_vs_min"])
    vs_min = [f"{k} {min(v):.2f}–{max(v):.2f}" for k, v in ratios.items()]
    # Per non-baseline row (default and its variants): lower p99 TTFT than every baseline, every run.
    p99_lead: dict[str, bool] = {}
    for run in runs:
        base = [r["ttft_p99_s"] for r in run["results"] if r["profile"] in BASELINES]
        for r in run["results"]:
            if r["profile"] not in BASELINES:
                lead = all(r["ttft_p99_s"] < b for b in base)
                p99_lead[r["profile"]] = p99_lead.get(r["profile"], True) and lead
    return {"default_wins_everywhere": all_win, "lines": lines, "vs_min": vs_min, "p99_lead": p99_lead}


if __name__ == "__main__":
    sys.exit(main())
