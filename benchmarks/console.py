"""Console page times with 1,000 adapters and 50 replicas (target: every page under 200 ms).

Builds a registry database (SQLite in a temp dir by default, ``--database-url`` for PostgreSQL)
with ``--adapters`` adapters of two versions each (v1 active, every fifth with v2 as a 10 %
canary, every tenth marked hot), 20 tenants with keys and grants, a replica directory of
``--replicas`` replicas holding 20 resident adapters each, and a traffic ring holding a full
hour (360 intervals) in which ``--traffic-series`` adapter versions all served; then signs in to the
console in-process (``httpx.ASGITransport``: the server's own time, no network) and times each
page ``--repeat`` times. Prints a table and writes ``benchmarks/results/console.json``.

    .venv/bin/python benchmarks/console.py
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import platform
import re
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
from fastapi import FastAPI
from pydantic import SecretStr
from sqlalchemy import Engine

from kit.db import make_engine, make_session_factory, session_scope
from registry import migrate
from registry.api import create_admin_app
from registry.console import set_traffic
from registry.console.traffic import Counters, Sample
from registry.console.traffic_ring import RingTraffic
from registry.demo import demo_base_model
from registry.services import adapters as adapter_svc
from registry.services import lifecycle, tenants
from registry.services.bootstrap import ensure_base_model
from registry.services.versions import register_version
from registry.settings import RegistrySettings

TOKEN = "console-bench-admin-token"
PAGES = (
    "/adapters",
    "/adapters?owner=team-3",
    "/adapters/adapter-0042",
    "/adapters/adapter-0005/confirm?action=promote&version=v2",
    "/replicas",
    "/traffic",
    "/tenants",
    "/tenants/tenant-01",
    "/principals",
    "/audit",
)


class FakeDirectory:
    """A ``registry.replicas.ReplicaDirectory`` with ``replicas`` replicas of 20 residents each."""

    def __init__(self, replicas: int, adapters: int) -> None:
        self._records: list[dict[str, Any]] = [
            {
                "url": f"http://10.0.{i // 250}.{i % 250}:8000",
                "pool": "bench",
                "base_model": "demo-base",
                "healthy": i % 17 != 0,
                "adapters": [
                    {
                        "adapter": f"adapter-{(i * 7 + j * 13) % adapters:04d}",
                        "version": "v1",
                        "lora_name": f"adapter-{(i * 7 + j * 13) % adapters:04d}@v1",
                        "state": "resident" if j % 9 else "loading",
                    }
                    for j in range(20)
                ],
                "running": i % 5,
                "waiting": i % 3,
                "last_seen": "2026-12-01T00:00:00Z",
            }
            for i in range(replicas)
        ]

    async def list_replicas(self) -> list[dict[str, Any]]:
        return self._records

    async def plan(self) -> dict[str, Any]:
        """The placement plan: one planned copy of every tenth adapter on its first replica."""
        planned = sorted({a["lora_name"] for r in self._records for a in r["adapters"]})[::10]
        return {
            "published": True,
            "at": "2026-12-01T00:00:00.000Z",
            "age_s": 1.0,
            "desired_replicas": {"bench": len(self._records)},
            "overflow": 0,
            "adapters": [
                {
                    "adapter": name.split("@")[0],
                    "version": "v1",
                    "lora_name": name,
                    "demand_rps": 1.0,
                    "planned_replicas": 1,
                    "targets": [self._records[0]["url"]],
                    "current": [],
                    "missing": [self._records[0]["url"]],
                }
                for name in planned
            ],
        }

    async def request_prewarm(self, adapter_id: str, version: str, replicas: int) -> dict[str, Any]:
        return {"targets": []}


def seed(engine: Engine, *, adapters: int, tenant_count: int = 20) -> None:
    """Adapters with two versions each, tenants with grants and keys: through the services."""
    factory = make_session_factory(engine)
    files = [{"name": "adapter_model.safetensors", "size": 1024, "sha256": "0" * 64}]
    with session_scope(factory) as s:
        ensure_base_model(s, demo_base_model())
    for start in range(0, adapters, 250):
        with session_scope(factory) as s:
            for n in range(start, min(start + 250, adapters)):
                aid = f"adapter-{n:04d}"
                adapter_svc.create_adapter(
                    s, adapter_id=aid, base_model="demo-base", owner=f"team-{n % 10}",
                    description=f"bench adapter {n}", hot=n % 10 == 0, actor="bench",
                )  # fmt: skip
                for _ in range(2):
                    register_version(
                        s, aid, rank=8, lora_alpha=16, target_modules=["q_proj", "v_proj"], files=files,
                        storage_uri=f"file:///bench/{aid}/", actor="bench",
                    )  # fmt: skip
                lifecycle.promote(s, aid, "v1", actor="bench")
                if n % 5 == 0:
                    lifecycle.promote(s, aid, "v2", canary_weight=10, actor="bench")
    with session_scope(factory) as s:
        for t in range(tenant_count):
            tid = f"tenant-{t:02d}"
            tenants.create_tenant(
                s, tenant_id=tid, name=None, limits={"rpm": 600}, base_model_access=False, actor="bench"
            )
            tenants.issue_key(s, tid, actor="bench")
            for n in range(t, adapters, 40):
                tenants.put_grant(s, tid, f"adapter-{n:04d}", rpm=None, tpm=None, actor="bench")


_LE = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, math.inf)


def _counters(t: int, k: int) -> Counters:
    n = t * (k % 7 + 1.0)
    return Counters(
        requests=n,
        errors=float(t // 50),
        tokens=t * 40.0,
        loads=1.0,
        ttft={le: n * min(1.0, (i + 1) / 8) for i, le in enumerate(_LE)},
        itl={le: t * 20.0 * min(1.0, (i + 1) / 6) for i, le in enumerate(_LE)},
    )


def full_hour(series: int, *, intervals: int = 360, step_s: float = 10.0) -> RingTraffic:
    """A traffic ring holding an hour of samples in which ``series`` adapter versions all served."""
    ring = RingTraffic([], capacity=intervals)
    for t in range(intervals + 1):
        ring.add(
            Sample(
                t * step_s,
                {(f"adapter-{k:04d}", "v1"): _counters(t, k) for k in range(series)},
            )
        )
    return ring


def build_app(
    database_url: str, data_dir: Path, *, replicas: int, adapters: int, traffic_series: int = 0
) -> FastAPI:
    settings = RegistrySettings(data_dir=data_dir, database_url=database_url, admin_token=SecretStr(TOKEN))
    migrate.upgrade(database_url)
    engine = make_engine(database_url)
    seed(engine, adapters=adapters)
    app = create_admin_app(settings, engine=engine, replica_directory=FakeDirectory(replicas, adapters))
    if traffic_series:
        set_traffic(app, full_hour(traffic_series))
    return app


async def signed_in_client(app: FastAPI) -> httpx.AsyncClient:
    client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://console.test")
    r = await client.get("/admin/ui/signin")
    match = re.search(r'name="csrf" value="([^"]+)"', r.text)
    assert match is not None
    r = await client.post("/admin/ui/signin", data={"csrf": match.group(1), "token": TOKEN})
    assert r.status_code == 303, r.text
    return client


async def time_pages(app: FastAPI, repeat: int) -> dict[str, dict[str, float]]:
    client = await signed_in_client(app)
    out: dict[str, dict[str, float]] = {}
    try:
        for page in PAGES:
            times = []
            for _ in range(repeat):
                t0 = time.perf_counter()
                r = await client.get("/admin/ui" + page)
                times.append((time.perf_counter() - t0) * 1000)
                assert r.status_code == 200, (page, r.status_code, r.text[:500])
            out[page] = {
                "p50_ms": statistics.median(times),
                "max_ms": max(times),
                "bytes": float(len(r.content)),
            }
    finally:
        await client.aclose()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--adapters", type=int, default=1000)
    ap.add_argument("--replicas", type=int, default=50)
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--traffic-series", type=int, default=1000, help="adapter versions with traffic all hour")
    ap.add_argument("--database-url", default=None, help="default: SQLite in a temp dir")
    ap.add_argument("--out", default="benchmarks/results/console.json")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="lp-console-bench-") as tmp:
        url = args.database_url or f"sqlite:///{tmp}/registry.db"
        t0 = time.perf_counter()
        app = build_app(
            url, Path(tmp), replicas=args.replicas, adapters=args.adapters, traffic_series=args.traffic_series
        )
        seeded = time.perf_counter() - t0
        results = asyncio.run(time_pages(app, args.repeat))
    print(
        f"{args.adapters} adapters, {args.replicas} replicas, {args.traffic_series} series with an hour "
        f"of traffic ({seeded:.1f} s to seed), {args.repeat} runs"
    )
    print(f"{'page':<58} {'p50 ms':>8} {'max ms':>8} {'KiB':>6}")
    for page, r in results.items():
        print(f"{page:<58} {r['p50_ms']:8.1f} {r['max_ms']:8.1f} {r['bytes'] / 1024:6.1f}")
    worst = max(r["p50_ms"] for r in results.values())
    print(f"slowest page p50: {worst:.1f} ms (target < 200 ms)")
    load = os.getloadavg()
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(
        json.dumps(
            {
                "adapters": args.adapters,
                "replicas": args.replicas,
                "repeat": args.repeat,
                "traffic_series": args.traffic_series,
                "traffic_intervals": 360,
                "database": "postgresql" if args.database_url else "sqlite",
                "pages": results,
                "slowest_p50_ms": worst,
                "target_ms": 200,
                "notes": {
                    "loadavg_1_5_15": [round(x, 2) for x in load],
                    "cpus": os.cpu_count(),
                    "python": platform.python_version(),
                    "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                },
            },
            indent=2,
        )
        + "\n"
    )


if __name__ == "__main__":
    main()
