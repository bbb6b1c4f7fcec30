"""Cold-load storm benchmark (SPEC §15): does a burst of cold loads for tail adapters hurt the
hot adapters' time to first token, with and without cold-load admission?

Two simulator replicas with the simulator's real timing model (a load's ``add_lora`` runs inside
the engine loop and delays its next step; ``--max-loras`` GPU slots shared by the running
adapters), the router in this process (its real placement, loader, cluster state and sender),
two hot adapters (marked hot, prewarmed) carrying steady streaming traffic, and after a warm-up
a burst of cold requests for ``--tail`` distinct tail adapters. Per configuration:

- ``unprotected``: no caps (``max_loads_per_replica`` 0, ``max_loads_per_pool`` 0,
  ``reserved_hot_slots`` 0) — every cold request starts its load at once;
- ``protected``: ``max_loads_per_replica`` 1, ``max_loads_per_pool`` 2, ``reserved_hot_slots``
  1 — loads queue, and cold adapters never take the slot kept for hot ones.

It reports the hot adapters' TTFT (p50/p99/max) before and during the storm, and how the cold
requests ended (served, 503). Usage::

    python -m benchmarks.cold_storm                 # both configurations
    python -m benchmarks.cold_storm --tail 60 --hot-rps 20

Prints a table and writes ``benchmarks/results/cold_storm.json``.
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

from registry.adapter_factory import write_adapter
from registry.audit_sink import MemoryAuditSink
from registry.snapshot import AdapterInfo, BaseModelInfo, FileInfo, RoutingSnapshot, VersionInfo
from registry.storage.local import LocalArtifactStore
from router.contract import ForwardRequest, RouterError
from router.core import Router
from router.settings import PoolConfig, RouterSettings
from simulator.procs import start_simulators, stop_all

RESULTS = Path(__file__).resolve().parent / "results"
CONFIGS: dict[str, dict[str, int]] = {
    "unprotected": {"max_loads_per_replica": 0, "max_loads_per_pool": 0, "reserved_hot_slots": 0},
    "protected": {"max_loads_per_replica": 1, "max_loads_per_pool": 2, "reserved_hot_slots": 1},
}


def put_version(store: LocalArtifactStore, tmp: Path, adapter_id: str, seed: int) -> VersionInfo:
    src = write_adapter(tmp / f"src-{adapter_id}", rank=8, seed=seed, layers=2)
    pending = store.begin(adapter_id)
    files: list[FileInfo] = []
    for name in ("adapter_config.json", "adapter_model.safetensors"):
        w = pending.writer(name)
        w.write((src / name).read_bytes())
        files.append(w.close())
    pending.commit()
    return VersionInfo(
        adapter_id=adapter_id, version="v1", number=1, status="active", rank=8, lora_alpha=16.0,
        target_modules=("q_proj", "v_proj"), files=tuple(files), storage_uri=pending.storage_uri,
        base_model="demo-base",
    )  # fmt: skip


def snapshot(versions: list[VersionInfo], hot: set[str]) -> RoutingSnapshot:
    adapters = {
        v.adapter_id: AdapterInfo(
            id=v.adapter_id,
            base_model="demo-base",
            status="active",
            active_version="v1",
            canary_version=None,
            canary_weight=None,
            versions={"v1": v},
            hot=v.adapter_id in hot,
        )
        for v in versions
    }
    base = BaseModelInfo("demo-base", "loraplane/demo-base", 64, ("q_proj", "v_proj"))
    return RoutingSnapshot(revision=1, base_models={"demo-base": base}, adapters=adapters)


def request(v: VersionInfo, rid: str, max_tokens: int) -> ForwardRequest:
    return ForwardRequest(
        request_id=rid, tenant_id="bench", base_model="demo-base", version=v, endpoint="chat/completions",
        body={"model": f"demo-base:{v.adapter_id}", "messages": [{"role": "user", "content": "hi"}],
              "max_tokens": max_tokens, "stream": True},
        client_model=f"demo-base:{v.adapter_id}", stream=True,
    )  # fmt: skip


async def one_stream(router: Router, req: ForwardRequest) -> float:
    """Seconds to the first streamed event (the router's TTFT), reading the stream to its end."""
    t0 = time.perf_counter()
    res = await router.forward(req)
    ttft = time.perf_counter() - t0
    assert res.stream is not None
    async for _ in res.stream:
        pass
    return ttft


def pct(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    s = sorted(xs)
    return s[min(len(s) - 1, round(q * (len(s) - 1)))]


async def run_config(
    name: str, caps: dict[str, int], urls: list[str], args: argparse.Namespace, tmp: Path
) -> dict[str, Any]:
    store = LocalArtifactStore(tmp / f"art-{name}")
    hot = [put_version(store, tmp, f"hot{i}-{name}", seed=i) for i in range(2)]
    tail = [put_version(store, tmp, f"tail{i}-{name}", seed=100 + i) for i in range(args.tail)]
    pool = PoolConfig(
        name="main", base_model="demo-base", urls=urls, max_loras=args.max_loras,
        max_adapters=args.max_adapters, reserved_hot_slots=caps["reserved_hot_slots"],
        staging={"mode": "local", "dir": str(tmp / f"staging-{name}")},  # type: ignore[arg-type]
    )  # fmt: skip
    settings = RouterSettings(
        pools=[pool], data_dir=tmp / f"data-{name}", poll_interval_s=0.25, reconcile_interval_s=0.5,
        load_timeout_s=args.load_timeout, hot_prewarm_replicas=2,
        max_loads_per_replica=caps["max_loads_per_replica"], max_loads_per_pool=caps["max_loads_per_pool"],
    )  # fmt: skip
    router = Router(settings, store=store, audit=MemoryAuditSink(), registry=CollectorRegistry())
    await router.start()
    try:
        router.update_snapshot(snapshot([*hot, *tail], {v.adapter_id for v in hot}))
        for v in hot:  # warm: prewarmed by the reconciler; one request each makes sure
            await one_stream(router, request(v, "warm", 4))
        before: list[float] = []
        during: list[float] = []
        storm_at = time.perf_counter() + args.warmup
        stop_at = storm_at + args.storm_window
        cold: list[str] = []

        async def hot_traffic(v: VersionInfo, k: int) -> None:
            n = 0
            period = 1.0 / args.hot_rps
            tasks: list[asyncio.Task[None]] = []

            async def go(i: int) -> None:
                t = time.perf_counter()
                try:
                    ttft = await one_stream(router, request(v, f"h{k}-{i}", args.hot_tokens))
                except RouterError:
                    ttft = float("inf")
                (during if storm_at <= t < stop_at else before if t < storm_at else []).append(ttft)

            while time.perf_counter() < stop_at:
                tasks.append(asyncio.create_task(go(n)))
                n += 1
                await asyncio.sleep(period)
            await asyncio.gather(*tasks)

        async def storm() -> None:
            await asyncio.sleep(max(0.0, storm_at - time.perf_counter()))

            async def go(v: VersionInfo) -> None:
                try:
                    await one_stream(router, request(v, f"c-{v.adapter_id}", args.cold_tokens))
                    cold.append("ok")
                except RouterError as exc:
                    cold.append(f"{exc.status} {exc.code}")

            await asyncio.gather(*(go(v) for v in tail))

        await asyncio.gather(*(hot_traffic(v, i) for i, v in enumerate(hot)), storm())
    finally:
        await router.stop()
    codes: dict[str, int] = {}
    for c in cold:
        codes[c] = codes.get(c, 0) + 1
    return {
        "config": name,
        **caps,
        "hot_requests_before": len(before),
        "hot_requests_during": len(during),
        "hot_ttft_before_p50_ms": round(pct(before, 0.5) * 1000, 1),
        "hot_ttft_before_p99_ms": round(pct(before, 0.99) * 1000, 1),
        "hot_ttft_during_p50_ms": round(pct(during, 0.5) * 1000, 1),
        "hot_ttft_during_p99_ms": round(pct(during, 0.99) * 1000, 1),
        "hot_ttft_during_max_ms": round(max(during) * 1000, 1) if during else None,
        "hot_failed": sum(1 for x in [*before, *during] if x == float("inf")),
        "cold_requests": len(cold),
        "cold_results": codes,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tail", type=int, default=40, help="cold adapters in the burst")
    ap.add_argument("--hot-rps", type=float, default=8.0, help="requests/s per hot adapter")
    ap.add_argument("--hot-tokens", type=int, default=16)
    ap.add_argument("--cold-tokens", type=int, default=16)
    ap.add_argument("--warmup", type=float, default=3.0, help="seconds of hot traffic before the storm")
    ap.add_argument("--storm-window", type=float, default=10.0, help="seconds measured from the storm")
    ap.add_argument("--max-loras", type=int, default=2)
    ap.add_argument("--max-adapters", type=int, default=16)
    ap.add_argument("--load-timeout", type=float, default=20.0)
    ap.add_argument("--configs", default="unprotected,protected")
    ap.add_argument("--out", type=Path, default=RESULTS / "cold_storm.json")
    args = ap.parse_args()
    sim_args = ["--max-loras", str(args.max_loras), "--max-cpu-loras", str(args.max_adapters)]
    sims = start_simulators(2, extra_args=sim_args)
    rows: list[dict[str, Any]] = []
    try:
        with tempfile.TemporaryDirectory(prefix="lp-coldstorm-") as tmp:
            for name in args.configs.split(","):
                rows.append(
                    asyncio.run(run_config(name, CONFIGS[name], [s.url for s in sims], args, Path(tmp)))
                )
                for s in sims:  # the next configuration starts with empty replicas
                    s.restart()
    finally:
        stop_all(sims)
    load = os.getloadavg()
    cols = ["config", "hot_ttft_before_p50_ms", "hot_ttft_before_p99_ms", "hot_ttft_during_p50_ms",
            "hot_ttft_during_p99_ms", "hot_ttft_during_max_ms", "hot_failed", "cold_results"]  # fmt: skip
    print(" | ".join(cols))
    for r in rows:
        print(" | ".join(str(r[c]) for c in cols))
    print(f"load average at the end: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    meta = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
    note = "TTFT is the router's: from forward() to the first streamed event (simulator timing model)"
    args.out.write_text(
        json.dumps({"args": meta, "loadavg": load, "note": note, "rows": rows}, indent=2) + "\n"
    )


if __name__ == "__main__":
    main()
