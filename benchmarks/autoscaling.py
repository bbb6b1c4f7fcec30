"""The autoscaling signal on a diurnal day (issue 28, item 5): does
``loraplane_pool_desired_replicas`` track the replicas the demand needs, and how late?

The placement controller's own code runs on the ``diurnal`` workload (``benchmarks/workloads``:
the rate swings 7× from trough to peak over one "day", each adapter with its own phase): every
``--tick`` seconds the requests of the last tick, per adapter, go through the controller's
forecaster (``router.placement.forecast.Forecaster``), and ``make_plan`` computes the desired
replicas from the forecast rates and the requests in flight (as the controller does from the
cluster's demand board and the replicas' counts). A request is in flight for its service time:
``--prefill-s`` + output tokens × ``--decode-s`` (a timing model, not an engine).

The **need** at each tick applies the same rule to the truth instead of the forecast — the
requests really in flight and the adapters really running — so the comparison isolates what the
forecast adds: lag behind a rising rate, slow decay after a falling one. A real HPA adds its own
stabilisation window on top (``deploy/autoscaling``).

Prints the day in 24 "hours" (mean offered rate, in flight, need, desired) and a summary —
correlation of desired with need, mean absolute error, share of ticks under the need, lag (the
shift of desired that best matches need) — and writes ``benchmarks/results/autoscaling.json``::

    python -m benchmarks.autoscaling
    python -m benchmarks.autoscaling --rate 20 --duration 1200
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks import workloads
from router.placement.forecast import Forecaster
from router.placement.plan import Demand, PlanParams, make_plan
from router.placement.table import ReplicaTable
from router.placement.types import ReplicaView

RESULTS = Path(__file__).resolve().parent / "results"
POOL = "pool"
COLUMNS = ("offered_rps", "inflight", "need", "desired")


def _table(replicas: int, max_num_seqs: int, max_loras: int, max_adapters: int) -> ReplicaTable:
    t = ReplicaTable()
    for i in range(replicas):
        t.put(
            ReplicaView(
                url=f"http://r{i}",
                pool=POOL,
                healthy=True,
                max_loras=max_loras,
                max_adapters=max_adapters,
                max_num_seqs=max_num_seqs,
            )
        )
    return t


def _need(inflight: Counter[str], max_num_seqs: int, max_loras: int, util: float) -> int:
    """The controller's rule on the truth: requests and adapters really in flight."""
    conc = sum(inflight.values())
    running = sum(1 for n in inflight.values() if n > 0)
    return max(1, math.ceil(conc / (max_num_seqs * util)), math.ceil(running / (max_loras * util)))


def run(args: argparse.Namespace) -> dict[str, Any]:
    trace = workloads.diurnal(
        n_adapters=args.adapters, rate=args.rate, duration_s=args.duration, seed=args.seed
    )
    params = PlanParams()
    table = _table(args.replicas, args.max_num_seqs, args.max_loras, args.max_adapters)
    arrivals = np.array([r.t for r in trace])
    ends = arrivals + args.prefill_s + np.array([r.output_tokens for r in trace]) * args.decode_s
    names = [r.adapter or "" for r in trace]
    forecaster = Forecaster()
    plan = None
    ticks: list[dict[str, float]] = []
    decide_s: list[float] = []
    t = args.tick
    while t <= args.duration:
        window = np.nonzero((arrivals >= t - args.tick) & (arrivals < t))[0]
        counts = Counter(names[i] for i in window)
        rates = forecaster.observe(counts, args.tick)
        live = np.nonzero((arrivals < t) & (ends > t))[0]
        inflight = Counter(names[i] for i in live)
        demands = [
            Demand(n, n, "v1", "base", rate, inflight=inflight.get(n, 0)) for n, rate in sorted(rates.items())
        ]
        t0 = time.perf_counter()
        plan = make_plan({"base": table}, demands, plan, params, t)
        decide_s.append(time.perf_counter() - t0)
        ticks.append(
            {
                "t": t,
                "offered_rps": len(window) / args.tick,
                "forecast_rps": sum(rates.values()),
                "inflight": float(sum(inflight.values())),
                "need": float(_need(inflight, args.max_num_seqs, args.max_loras, params.target_util)),
                "desired": float(plan.desired.get(POOL, 0)),
            }
        )
        t += args.tick
    need = np.array([x["need"] for x in ticks])
    desired = np.array([x["desired"] for x in ticks])
    best_lag, best_err = 0, float("inf")
    for lag in range(0, 11):  # desired shifted back by `lag` ticks against need
        err = float(np.mean(np.abs(desired[lag:] - need[: len(need) - lag])))
        if err < best_err:
            best_lag, best_err = lag, err
    hours = []
    for h in range(24):
        lo, hi = args.duration * h / 24, args.duration * (h + 1) / 24
        sel = [x for x in ticks if lo < x["t"] <= hi]
        if sel:
            hours.append({k: round(float(np.mean([x[k] for x in sel])), 2) for k in COLUMNS} | {"hour": h})
    summary = {
        "ticks": len(ticks),
        "corr_desired_need": round(float(np.corrcoef(desired, need)[0, 1]), 3),
        "mean_abs_error_replicas": round(float(np.mean(np.abs(desired - need))), 2),
        "share_of_ticks_under_need": round(float(np.mean(desired < need)), 3),
        "share_of_ticks_over_need": round(float(np.mean(desired > need)), 3),
        "need_min_max": [int(need.min()), int(need.max())],
        "desired_min_max": [int(desired.min()), int(desired.max())],
        "lag_ticks": best_lag,
        "lag_s": best_lag * args.tick,
        "mean_abs_error_at_lag": round(best_err, 2),
        "decide_ms_p50": round(float(np.percentile(decide_s, 50)) * 1000, 3),
    }
    return {"summary": summary, "hours": hours, "ticks": ticks}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--adapters", type=int, default=300)
    ap.add_argument("--rate", type=float, default=40.0, help="mean requests per second over the day")
    ap.add_argument("--duration", type=float, default=600.0, help="seconds in the simulated day")
    ap.add_argument("--tick", type=float, default=3.0, help="the controller's period (plan_interval_s)")
    ap.add_argument("--replicas", type=int, default=8, help="replicas in the pool now (the table)")
    ap.add_argument("--max-num-seqs", type=int, default=32)
    ap.add_argument("--max-loras", type=int, default=8)
    ap.add_argument("--max-adapters", type=int, default=32)
    ap.add_argument("--prefill-s", type=float, default=0.05)
    ap.add_argument("--decode-s", type=float, default=0.02)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=RESULTS / "autoscaling.json")
    args = ap.parse_args()
    result = run(args)
    print("hour | offered rps | in flight | need | desired")
    for h in result["hours"]:
        row = f"{h['offered_rps']:11.1f} | {h['inflight']:9.1f} | {h['need']:4.1f} | {h['desired']:7.1f}"
        print(f"{h['hour']:4d} | {row}")
    for k, v in result["summary"].items():
        print(f"{k}: {v}")
    load = os.getloadavg()
    print(f"load average at the end: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    config = {k: v for k, v in vars(args).items() if k != "out"}
    note = (
        "the controller's forecaster and make_plan on the diurnal workload; need = the same rule on "
        "the requests really in flight (timing model: prefill_s + output tokens x decode_s)"
    )
    args.out.write_text(
        json.dumps({"config": config, "note": note, "loadavg": load, **result}, indent=2) + "\n"
    )


if __name__ == "__main__":
    main()
