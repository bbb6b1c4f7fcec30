"""Routing benchmark: replay workloads through each placement profile against simulated replicas.

The replay (``benchmarks/replay.py``) runs every replica's ``simulator.engine.EngineModel`` in
virtual time with the router side modelled as loraplane's runtime does it (residency records,
in-flight counts, singleflight loads, ``Decision.evict`` executed as is, scraped gauges, the
approximate prefix index), so a trace of minutes replays in seconds and every count except the
decision time does not depend on the machine's load.

Workloads (``benchmarks/workloads.py``, seeded): Zipf α 0.3/0.6/0.8/1.2, diurnal, flash crowd,
MMPP bursts, shared system prompts with multi-turn sessions, one heavy tenant. Profiles:
loraplane's ``default``; the Dynamo-style controller and the llm-d default scorer set
(``benchmarks/baselines``); GIE-style LoRA affinity, least-request, round-robin, random
(``router.placement``); on the shared-prefix trace also ``prefix-oracle`` (the replica holding
the adapter with the longest true cached prefix).

Per trace: the offline lower bound on loads (``benchmarks/bounds.py``, Belady's MIN on one cache
of replicas × max_adapters), and per profile loads (×MIN), loads per tier (cold loads by the
router, CPU → GPU copies, disk re-reads), p50/p99 TTFT, prefill tokens computed, slot churn,
Jain's index over per-tenant mean TTFT, decision time. Then each of issue 28's targets, met or
not, per trace.

Usage::

    python -m benchmarks.routing                          # every workload, 180 s each, seed 0
    python -m benchmarks.routing --workloads zipf-1.2,mmpp --duration 600 --seed 1
    python -m benchmarks.routing --trace my.jsonl         # a trace file instead

Workloads run in ``--jobs`` worker processes (2 by default); each prints its table when done.
Writes ``benchmarks/results/routing.json``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make the repository root importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import workloads as wl
from benchmarks.baselines import BENCH_PROFILES, make_bench_profile
from benchmarks.bounds import bounds
from benchmarks.replay import ClusterConfig, RunResult, replay
from benchmarks.targets import check_targets, decision_scaling
from benchmarks.traces import TraceRequest, read_trace
from router.placement import make_profile
from router.placement.types import Profile

__all__ = ["PROFILES", "ClusterConfig", "RunResult", "main", "replay"]

PROFILES = ("default", "dynamo", "llm-d", "gie-lora-affinity", "least-request", "round-robin", "random")
RESULTS = Path(__file__).resolve().parent / "results"


def build(name: str, seed: int, params: dict[str, Any]) -> Profile:
    if name in BENCH_PROFILES:
        return make_bench_profile(name, **({"seed": seed} if name == "llm-d" else {}))
    if name in ("random", "gie-lora-affinity"):
        return make_profile(name, seed=seed)
    return make_profile(name, **(params if name == "default" else {}))


HEADER = (
    f"  {'profile':<17} {'loads':>5} {'xMIN':>5} {'cpu':>5} {'disk':>5} {'p50':>6} {'p99':>6} "
    f"{'prefill':>8} {'churn':>5} {'jain':>5} {'dec':>6} {'dec99':>6}\n"
    f"  {'':<17} {'':>5} {'':>5} {'':>5} {'':>5} {'ms':>6} {'ms':>6} {'ktok':>8} {'':>5} {'':>5} "
    f"{'µs':>6} {'µs':>6}"
)


def _row(r: RunResult) -> str:
    return (
        f"  {r.profile:<17} {r.loads:>5} {r.loads_vs_min:>5.2f} {r.cpu_reloads:>5} {r.disk_rereads:>5} "
        f"{r.ttft_p50_s * 1000:>6.0f} {r.ttft_p99_s * 1000:>6.0f} {r.prefill_tokens / 1000:>8.0f} "
        f"{r.churn:>5} {r.jain_ttft:>5.2f} {r.decision_us_mean:>6.0f} {r.decision_us_p99:>6.0f}"
    )


def _run_one(
    job: tuple[str, list[TraceRequest], ClusterConfig, list[str], int, dict[str, Any]],
) -> tuple[str, dict[str, Any]]:
    """One workload through every profile: (its printed table, its report entry)."""
    name, trace, cfg, profiles, seed, params = job
    out: list[str] = []
    bound = bounds([r.adapter for r in trace], cfg.replicas * cfg.max_adapters)
    prompt = sum(r.prompt_tokens for r in trace)
    out.append(f"\n== {name}: {len(trace)} requests, {prompt / 1000:.0f}k prompt tokens")
    out.append(
        f"  lower bound on loads: {bound['compulsory']} compulsory, {bound['belady_min']} Belady MIN "
        f"(one cache of {bound['capacity']})"
    )
    out.append(HEADER)
    rows = list(profiles)
    if name == wl.PREFIX and "prefix-oracle" not in rows:
        rows.append("prefix-oracle")
    results = []
    for label in rows:
        source = "engine" if label == "prefix-oracle" else "index"
        r = replay(trace, build(label, seed, params), cfg, prefix_source=source)
        r.profile = label
        r.loads_vs_min = r.loads / bound["belady_min"] if bound["belady_min"] else math.nan
        results.append(r)
        out.append(_row(r))
    refused = [r.profile for r in results if r.decisions.get("no-capacity")]
    if refused:
        out.append(
            f"  note: {', '.join(refused)} refused requests (retried later): xMIN is approximate there"
        )
    for r in results:
        t = r.tenant_p99_s
        if t:
            out.append(
                f"  {r.profile:<17} tenant p99 ms: heavy {t['heavy'] * 1000:.0f}, "
                f"light {t['light'] * 1000:.0f}, worst light tenant {t['worst_light'] * 1000:.0f}"
            )
    run = {"workload": name, "requests": len(trace), "bound": bound, "results": [asdict(r) for r in results]}
    return "\n".join(out), run


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trace", type=Path, help="JSON-lines trace file (instead of the workloads)")
    ap.add_argument("--workloads", default=",".join(wl.WORKLOADS))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--rate", type=float, default=4.0, help="mean requests per second")
    ap.add_argument("--duration", type=float, default=180.0, help="seconds per workload")
    ap.add_argument("--jobs", type=int, default=2, help="worker processes (workloads in parallel)")
    ap.add_argument("--replicas", type=int, default=4)
    ap.add_argument("--max-loras", type=int, default=4)
    ap.add_argument("--max-adapters", type=int, default=16)
    ap.add_argument("--max-cpu-loras", type=int, default=8)
    ap.add_argument("--prefix-cache-blocks", type=int, default=4096, help="per replica, 16 tokens each")
    ap.add_argument("--adapter-mb", type=float, default=32.0)
    ap.add_argument("--load-overhead", type=float, default=0.1, help="router-side seconds per load")
    ap.add_argument("--profiles", default=",".join(PROFILES))
    ap.add_argument("--params", default="{}", help="JSON params for the default profile")
    ap.add_argument("--no-scaling", action="store_true", help="skip the 100 vs 1,000 replicas decision time")
    ap.add_argument("--out", type=Path, default=RESULTS / "routing.json")
    a = ap.parse_args(argv)

    cfg = ClusterConfig(
        replicas=a.replicas,
        max_loras=a.max_loras,
        max_adapters=a.max_adapters,
        adapter_bytes=int(a.adapter_mb * 1024 * 1024),
        load_overhead_s=a.load_overhead,
        max_cpu_loras=a.max_cpu_loras,
        prefix_cache_blocks=a.prefix_cache_blocks,
    )
    params = json.loads(a.params)
    profiles = [p for p in a.profiles.split(",") if p]
    runs: list[tuple[str, list[TraceRequest]]] = []
    if a.trace:
        runs.append((a.trace.name, read_trace(a.trace)))
    else:
        for name in [w for w in a.workloads.split(",") if w]:
            runs.append((name, wl.make(name, duration_s=a.duration, seed=a.seed, rate=a.rate)))

    started = time.time()
    load0 = os.getloadavg()
    print(f"load average at start: {load0[0]:.2f} ({os.cpu_count()} CPUs); cluster {asdict(cfg)}")
    report: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d %H:%M:%S %z"),
        "cluster": asdict(cfg),
        "seed": a.seed,
        "rate": a.rate,
        "duration_s": a.duration,
        "default_params": params,
        "load_average_start": load0,
        "runs": [],
    }
    jobs = [(name, trace, cfg, profiles, a.seed, params) for name, trace in runs]
    if a.jobs > 1 and len(jobs) > 1:
        with ProcessPoolExecutor(max_workers=a.jobs) as pool:
            done = list(pool.map(_run_one, jobs))
    else:
        done = [_run_one(j) for j in jobs]
    for text, run in done:
        print(text, flush=True)
        report["runs"].append(run)
    scaling = None if a.no_scaling else decision_scaling()
    report["decision_scaling"] = scaling
    report["targets"] = check_targets(report["runs"], scaling)
    print("\n== issue 28 targets (default against the best of dynamo and llm-d, round-robin, MIN, oracle)")
    for line in report["targets"]["lines"]:
        print("  " + line)
    report["load_average_end"] = os.getloadavg()
    report["wall_s"] = round(time.time() - started, 1)
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(report, indent=1))
    print(f"\nwrote {a.out} ({report['wall_s']} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
