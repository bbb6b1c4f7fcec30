"""Fairness under saturation: one heavy tenant flooding cold requests and N light tenants, with
the waiters for a GPU slot ordered FIFO or by virtual token counters (``router.fairness``).

The router runs in this process (its real placement, loader, fair queues, cluster state and
sender) in front of two simulator replicas with the simulator's timing model, few adapter slots
(``--max-adapters``) and slow loads (``--slow-load-s``), so nearly every request needs a load and
loads queue behind ``max_loads_per_replica``. Arrivals are open-loop: the heavy tenant offers
``--heavy-rps`` over ``--heavy-adapters`` adapters (far above what the loads allow), each light
tenant ``--light-rps`` alternating over its own two adapters. A request that finds no slot
within ``--load-timeout`` gets 503.

Per tenant: requests offered and served, TTFT p50/p99 of the served (from ``forward()`` to the
first streamed event). Jain's index is over each tenant's served rate divided by its max-min
fair share of the total served rate (water-filling over the offered rates; 1.0 = every tenant got
its fair share, light tenants all they asked). Usage::

    python -m benchmarks.fairness                   # fifo, then vtc
    python -m benchmarks.fairness --light 8 --duration 30

Prints a table and writes ``benchmarks/results/fairness.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make the repository root importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from prometheus_client import CollectorRegistry

from benchmarks.cold_storm import pct, put_version, snapshot
from registry.audit_sink import MemoryAuditSink
from registry.snapshot import VersionInfo
from registry.storage.local import LocalArtifactStore
from router.contract import ForwardRequest, RouterError
from router.core import Router
from router.settings import PoolConfig, RouterSettings
from simulator.procs import start_simulators, stop_all

RESULTS = Path(__file__).resolve().parent / "results"


def request(tenant: str, v: VersionInfo, rid: str, max_tokens: int) -> ForwardRequest:
    return ForwardRequest(
        request_id=rid, tenant_id=tenant, base_model="demo-base", version=v, endpoint="chat/completions",
        body={"model": f"demo-base:{v.adapter_id}", "messages": [{"role": "user", "content": "hi " * 20}],
              "max_tokens": max_tokens, "stream": True},
        client_model=f"demo-base:{v.adapter_id}", stream=True,
    )  # fmt: skip


def fair_shares(offered: dict[str, float], capacity: float) -> dict[str, float]:
    """Max-min fair shares of ``capacity`` among demands ``offered`` (water-filling)."""
    shares: dict[str, float] = {}
    left = dict(offered)
    cap = capacity
    while left:
        even = cap / len(left)
        small = {t: d for t, d in left.items() if d <= even}
        if not small:
            shares.update({t: even for t in left})
            break
        for t, d in small.items():
            shares[t] = d
            cap -= d
            del left[t]
    return shares


def jain(xs: list[float]) -> float:
    return sum(xs) ** 2 / (len(xs) * sum(x * x for x in xs)) if xs and any(xs) else 0.0


async def run_config(policy: str, urls: list[str], args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    store = LocalArtifactStore(tmp / f"art-{policy}")
    tenants: dict[str, list[VersionInfo]] = {
        "heavy": [put_version(store, tmp, f"h{i}-{policy}", seed=i) for i in range(args.heavy_adapters)]
    }
    for k in range(args.light):
        tenants[f"light{k}"] = [
            put_version(store, tmp, f"l{k}-{j}-{policy}", seed=500 + 2 * k + j) for j in (0, 1)
        ]
    pool = PoolConfig(
        name="main", base_model="demo-base", urls=urls, max_loras=args.max_loras,
        max_adapters=args.max_adapters, staging={"mode": "local", "dir": str(tmp / f"staging-{policy}")},  # type: ignore[arg-type]
    )  # fmt: skip
    settings = RouterSettings(
        pools=[pool], data_dir=tmp / f"data-{policy}", poll_interval_s=0.25, reconcile_interval_s=0.5,
        load_timeout_s=args.load_timeout, max_loads_per_replica=1, max_loads_per_pool=2, plan_interval_s=0,
        fairness=policy,  # type: ignore[arg-type]
    )  # fmt: skip
    router = Router(settings, store=store, audit=MemoryAuditSink(), registry=CollectorRegistry())
    await router.start()
    ttft: dict[str, list[float]] = {t: [] for t in tenants}
    offered: dict[str, int] = {t: 0 for t in tenants}
    refused: dict[str, int] = {t: 0 for t in tenants}
    try:
        router.update_snapshot(snapshot([v for vs in tenants.values() for v in vs], set()))
        await asyncio.sleep(1.0)
        t_start = time.perf_counter()
        stop_at = t_start + args.duration

        async def one(tenant: str, v: VersionInfo, rid: str) -> None:
            t0 = time.perf_counter()
            try:
                res = await router.forward(request(tenant, v, rid, args.tokens))
                first = time.perf_counter() - t0
                assert res.stream is not None
                async for _ in res.stream:
                    pass
                ttft[tenant].append(first)
            except RouterError:
                refused[tenant] += 1

        async def traffic(tenant: str, rps: float) -> None:
            vs = tenants[tenant]
            tasks: list[asyncio.Task[None]] = []
            n = 0
            next_at = time.perf_counter()
            while next_at < stop_at:
                await asyncio.sleep(max(0.0, next_at - time.perf_counter()))
                tasks.append(asyncio.create_task(one(tenant, vs[n % len(vs)], f"{tenant}-{n}")))
                offered[tenant] += 1
                n += 1
                next_at += 1.0 / rps
            await asyncio.gather(*tasks)

        await asyncio.gather(
            traffic("heavy", args.heavy_rps), *(traffic(t, args.light_rps) for t in tenants if t != "heavy")
        )
    finally:
        await router.stop()
    loads = {"heavy": 0.0, "light": 0.0}  # finished loads, by the tenant whose adapter it was
    for metric in router.metrics.registry.collect():
        for sample in metric.samples:
            if sample.name == "loraplane_adapter_loads_total" and sample.labels.get("result") == "ok":
                loads["heavy" if sample.labels["adapter"].startswith("h") else "light"] += sample.value
    served = {t: len(xs) for t, xs in ttft.items()}
    shares = fair_shares({t: float(n) for t, n in offered.items()}, float(sum(served.values())))
    norm = [min(1.0, served[t] / shares[t]) if shares[t] else 1.0 for t in tenants]
    light = [x for t, xs in ttft.items() if t != "heavy" for x in xs]
    return {
        "policy": policy,
        "jain": round(jain(norm), 3),
        "heavy_offered": offered["heavy"],
        "heavy_served": served["heavy"],
        "heavy_ttft_p50_ms": round(pct(ttft["heavy"], 0.5) * 1000, 1),
        "heavy_ttft_p99_ms": round(pct(ttft["heavy"], 0.99) * 1000, 1),
        "light_offered": sum(offered[t] for t in tenants if t != "heavy"),
        "light_served": len(light),
        "light_ttft_p50_ms": round(pct(light, 0.5) * 1000, 1),
        "light_ttft_p99_ms": round(pct(light, 0.99) * 1000, 1),
        "heavy_loads": int(loads["heavy"]),
        "light_loads": int(loads["light"]),
        "heavy_served_per_load": round(served["heavy"] / loads["heavy"], 2) if loads["heavy"] else None,
        "per_tenant": {
            t: {
                "offered": offered[t],
                "served": served[t],
                "refused_503": refused[t],
                "fair_share": round(shares[t], 1),
                "ttft_p50_ms": round(pct(ttft[t], 0.5) * 1000, 1),
                "ttft_p99_ms": round(pct(ttft[t], 0.99) * 1000, 1),
            }
            for t in tenants
        },
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--light", type=int, default=6, help="light tenants")
    ap.add_argument("--heavy-rps", type=float, default=60.0, help="requests/s of the heavy tenant")
    ap.add_argument("--light-rps", type=float, default=0.5, help="requests/s of each light tenant")
    ap.add_argument("--heavy-adapters", type=int, default=40)
    ap.add_argument("--duration", type=float, default=15.0, help="seconds of arrivals per policy")
    ap.add_argument("--tokens", type=int, default=8, help="max_tokens of each request")
    ap.add_argument("--max-loras", type=int, default=2)
    ap.add_argument("--max-adapters", type=int, default=4)
    ap.add_argument("--slow-load-s", type=float, default=0.3, help="extra seconds of every load")
    ap.add_argument("--load-timeout", type=float, default=5.0)
    ap.add_argument("--policies", default="fifo,vtc")
    ap.add_argument("--out", type=Path, default=RESULTS / "fairness.json")
    args = ap.parse_args()
    sim_args = ["--max-loras", str(args.max_loras), "--max-cpu-loras", str(args.max_adapters),
                "--slow-load-s", str(args.slow_load_s)]  # fmt: skip
    sims = start_simulators(2, extra_args=sim_args)
    rows: list[dict[str, Any]] = []
    try:
        with tempfile.TemporaryDirectory(prefix="lp-fairness-") as tmp:
            for policy in args.policies.split(","):
                rows.append(asyncio.run(run_config(policy, [s.url for s in sims], args, Path(tmp))))
                for s in sims:  # the next policy starts with empty replicas
                    s.restart()
    finally:
        stop_all(sims)
    load = os.getloadavg()
    cols = ["policy", "jain", "heavy_offered", "heavy_served", "heavy_ttft_p50_ms", "heavy_ttft_p99_ms",
            "light_offered", "light_served", "light_ttft_p50_ms", "light_ttft_p99_ms",
            "heavy_loads", "light_loads", "heavy_served_per_load"]  # fmt: skip
    print(" | ".join(cols))
    for r in rows:
        print(" | ".join(str(r[c]) for c in cols))
    print(f"load average at the end: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    meta = {k: v for k, v in vars(args).items() if k != "out"}  # no machine paths in results
    note = (
        "in-process router, two simulator replicas (timing model); TTFT from forward() to the first "
        "streamed event; jain over served / max-min fair share per tenant"
    )
    args.out.write_text(
        json.dumps({"args": meta, "loadavg": load, "note": note, "rows": rows}, indent=2) + "\n"
    )


if __name__ == "__main__":
    main()
