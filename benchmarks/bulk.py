"""Bulk rollback benchmark (SPEC §14): roll back 1,000 adapters in one call on PostgreSQL and
measure how long the call takes and how long until a running gateway serves the rolled-back
versions.

Set-up (real processes, as ``benchmarks/propagation.py`` starts them): a fresh PostgreSQL
database, a Redis key prefix, ``--replicas`` simulator replicas (zero latency), one ``loraplane
serve --role registry`` and ``--gateways`` ``loraplane serve --role gateway``. ``--adapters``
adapters of owner ``bench``, each with v1 then v2 promoted (v2 active, v1 its rollback target),
written straight through the registry's services (uploading 2,000 versions would measure the
upload path, not this); one real upload supplies the files they share. A tenant with a grant for
every adapter drives ``--probes`` of them (spread over the list) through every gateway, both
versions made resident first so a probe's flip measures routing, not adapter loading.

Measured, while the probes keep asking: the wall time of ``POST /admin/v1/bulk/rollback`` with
``{"selector": {"owner": "bench"}}`` (each adapter its own transaction, audit event and change
notice); per gateway, the time from the call's start and from its answer until the gateway's
routing table reaches the registry's final revision (every rollback applied), the time until
every probe answered with v1, and how the gateway applied the 1,000 changes (whole reloads vs
incremental applies: the change feed must coalesce, not collapse). ``uptime``'s load average
is recorded: the machine is shared.

    .venv/bin/python benchmarks/bulk.py [--adapters 1000] [--gateways 1] [--probes 6]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.propagation import (  # noqa: E402
    TOKEN,
    ms,
    platform_env,
    start_gateways,
    start_registry,
    table_status,
)
from kit import localservices as ls  # noqa: E402
from kit.db import make_engine, make_session_factory, session_scope  # noqa: E402
from kit.procs import ManagedProcess  # noqa: E402
from kit.procs import stop_all as stop_procs  # noqa: E402
from registry.adapter_factory import write_adapter  # noqa: E402
from registry.admin_client import AdminClient  # noqa: E402
from registry.demo import demo_base_model  # noqa: E402

OWNER = "bench"
VERSION_HEADER = "x-loraplane-adapter-version"
MSG = [{"role": "user", "content": "hi"}]


def log(msg: str) -> None:
    print(f"[bulk] {msg}", file=sys.stderr, flush=True)


def adapter_ids(n: int) -> list[str]:
    return [f"bulk-{i:04d}" for i in range(n)]


def seed(admin_url: str, pg: str, work: Path, n: int) -> str:
    """The first adapter through the API (real files), the others through the services."""
    from registry.models import VersionRow
    from registry.services import adapters as adapter_svc
    from registry.services import lifecycle
    from registry.services import tenants as tenant_svc
    from registry.services.versions import register_version

    ids = adapter_ids(n)
    with AdminClient(admin_url, TOKEN) as a:
        spec = demo_base_model()
        a.create_base_model(
            spec["name"], spec["hf_id"], spec["max_lora_rank"], spec["target_modules"], spec["module_shapes"]
        )
        a.create_adapter(ids[0], "demo-base", owner=OWNER)
        for n_seed in (1, 2):
            d = work / "src" / f"v{n_seed}"
            write_adapter(d, seed=n_seed, rank=8, target_modules=("q_proj", "v_proj"))
            a.upload_version(ids[0], d)
        a.promote(ids[0], "v1")
        a.promote(ids[0], "v2")
        a.create_tenant(
            "bench", limits={"rpm": 100_000_000, "tpm": 2_000_000_000, "max_concurrency": 100_000}
        )
        a.put_grant("bench", ids[0])
        key = str(a.issue_key("bench")["key"])
    engine = make_engine(pg)
    factory = make_session_factory(engine)
    with session_scope(factory) as s:
        rows = s.query(VersionRow).filter(VersionRow.adapter_id == ids[0]).order_by(VersionRow.number).all()
        templates: list[dict[str, Any]] = [
            {
                "rank": r.rank,
                "lora_alpha": r.lora_alpha,
                "target_modules": list(r.target_modules),
                "files": list(r.files),
                "storage_uri": r.storage_uri,
            }
            for r in rows
        ]
    t0 = time.perf_counter()
    for i, aid in enumerate(ids[1:], 1):
        with session_scope(factory) as s:
            adapter_svc.create_adapter(
                s, adapter_id=aid, base_model="demo-base", owner=OWNER, description=None, actor="bench"
            )
            for t in templates:
                register_version(s, aid, actor="bench", **t)
            lifecycle.promote(s, aid, "v1", actor="bench")
            lifecycle.promote(s, aid, "v2", actor="bench")
            tenant_svc.put_grant(s, "bench", aid, rpm=None, tpm=None, actor="bench")
        if i % 200 == 0:
            log(f"seeded {i + 1}/{n} adapters ({time.perf_counter() - t0:.0f} s)")
    engine.dispose()
    return key


def registry_revision(pg: str) -> int:
    import sqlalchemy as sa

    engine = make_engine(pg)
    try:
        with engine.connect() as conn:
            return int(
                conn.execute(sa.text("SELECT revision FROM registry_state WHERE id = 1")).scalar() or 0
            )
    finally:
        engine.dispose()


async def ask(s: aiohttp.ClientSession, gw: str, key: str, model: str) -> tuple[int, str | None]:
    body = {"model": model, "messages": MSG, "max_tokens": 1}
    try:
        async with s.post(
            f"{gw}/v1/chat/completions", json=body, headers={"authorization": f"Bearer {key}"}
        ) as r:
            await r.read()
            return r.status, r.headers.get(VERSION_HEADER)
    except (aiohttp.ClientError, TimeoutError):
        return 0, None


async def warm(gw_urls: list[str], key: str, probes: list[str], want: str) -> None:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as s:
        for gw in gw_urls:
            for aid in probes:
                for pinned in (f"demo-base:{aid}@v1", f"demo-base:{aid}@v2"):
                    for _ in range(200):
                        if (await ask(s, gw, key, pinned))[0] == 200:
                            break
                        await asyncio.sleep(0.1)
                for _ in range(600):
                    if (await ask(s, gw, key, f"demo-base:{aid}"))[1] == want:
                        break
                    await asyncio.sleep(0.1)
                else:
                    raise RuntimeError(f"{gw} never served {aid} {want}")


async def measure(admin_url: str, gw_urls: list[str], key: str, probes: list[str], pg: str) -> dict[str, Any]:
    stop = asyncio.Event()
    first_v1: dict[tuple[str, str], float] = {}
    answers: list[int] = []
    timeout = aiohttp.ClientTimeout(total=120)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), timeout=timeout) as s:

        async def probe(gw: str, aid: str) -> None:
            while not stop.is_set():
                status, version = await ask(s, gw, key, f"demo-base:{aid}")
                answers.append(status)
                if status == 200 and version == "v1" and (gw, aid) not in first_v1:
                    first_v1[(gw, aid)] = time.perf_counter()
                await asyncio.sleep(0.02)  # light: the probes share the CPUs with the registry

        before = [await table_status(s, gw) for gw in gw_urls]
        workers = [asyncio.create_task(probe(gw, aid)) for gw in gw_urls for aid in probes]
        await asyncio.sleep(1.0)
        answers.clear()
        body = {"selector": {"owner": OWNER}, "reason": "benchmark", "dry_run": False}
        t0 = time.perf_counter()
        async with s.post(
            f"{admin_url}/admin/v1/bulk/rollback", json=body, headers={"authorization": f"Bearer {TOKEN}"}
        ) as r:
            result = await r.json()
            if r.status != 200:
                raise RuntimeError(f"bulk rollback answered {r.status}: {result}")
        t1 = time.perf_counter()
        final = await asyncio.to_thread(registry_revision, pg)
        table_done: dict[str, float] = {}
        deadline = time.perf_counter() + 120
        while time.perf_counter() < deadline and (
            len(table_done) < len(gw_urls) or len(first_v1) < len(gw_urls) * len(probes)
        ):
            for gw in gw_urls:
                if gw not in table_done and ((await table_status(s, gw)).get("revision") or 0) >= final:
                    table_done[gw] = time.perf_counter()
            await asyncio.sleep(0.01)
        stop.set()
        await asyncio.gather(*workers, return_exceptions=True)
        after = [await table_status(s, gw) for gw in gw_urls]
    per_gateway = []
    for gw, b, a in zip(gw_urls, before, after, strict=True):
        flips = [first_v1[(gw, aid)] for aid in probes if (gw, aid) in first_v1]
        done = table_done.get(gw)
        per_gateway.append(
            {
                "gateway": gw,
                "table_at_final_from_call_start_ms": ms(done - t0) if done else None,
                "table_at_final_after_answer_ms": ms(max(0.0, done - t1)) if done else None,
                "probes_on_v1": len(flips),
                "all_probes_v1_from_call_start_ms": ms(max(flips) - t0)
                if len(flips) == len(probes)
                else None,
                "all_probes_v1_after_answer_ms": (
                    ms(max(0.0, max(flips) - t1)) if len(flips) == len(probes) else None
                ),
                "whole_reloads": _delta(a, b, "reloads"),
                "incremental_applies": _delta(a, b, "applies"),
                "changes_applied": _delta(a, b, "changes_applied"),
                "gaps": _delta(a, b, "gaps"),
            }
        )
    return {
        "call_wall_ms": ms(t1 - t0),
        "per_adapter_ms": round((t1 - t0) * 1000 / max(1, len(result["results"])), 3),
        "applied": result["applied"],
        "failed": result["failed"],
        "final_revision": final,
        "requests_during": len(answers),
        "failed_requests_during": sum(1 for x in answers if x != 200),
        "gateways": per_gateway,
    }


def _delta(a: dict[str, Any], b: dict[str, Any], k: str) -> int | None:
    if not isinstance(a.get(k), int) or not isinstance(b.get(k), int):
        return None
    return int(a[k]) - int(b[k])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--adapters", type=int, default=1000)
    ap.add_argument("--gateways", type=int, default=1)
    ap.add_argument("--replicas", type=int, default=2)
    ap.add_argument("--probes", type=int, default=6, help="adapters the probes ask for, per gateway")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "bulk.json"))
    args = ap.parse_args()
    from simulator.procs import start_simulators, stop_all

    work = Path(tempfile.mkdtemp(prefix="lp-bench-bulk-"))
    prefix = ls.unique_redis_prefix("benchbulk")
    load_before = os.getloadavg()
    ids = adapter_ids(args.adapters)
    step = max(1, (len(ids) - 1) // max(1, args.probes - 1))
    probes = sorted({ids[min(len(ids) - 1, i * step)] for i in range(args.probes)} | {ids[-1]})
    procs: list[ManagedProcess] = []
    sims = start_simulators(args.replicas, extra_args=["--zero-latency", "--max-loras", "8"])
    try:
        with ls.temp_pg_database("benchbulk") as pg:
            env = platform_env(work, pg, prefix, [p.url for p in sims], ROOT)
            registry, admin_url = start_registry(work, env, ROOT)
            procs.append(registry)
            log(f"seeding {args.adapters} adapters …")
            t_seed = time.perf_counter()
            key = seed(admin_url, pg, work, args.adapters)
            log(f"seeded in {time.perf_counter() - t_seed:.0f} s; starting {args.gateways} gateway(s) …")
            gateways, gw_urls = start_gateways(work, env, ROOT, args.gateways)
            procs += gateways
            asyncio.run(warm(gw_urls, key, probes, "v2"))
            log(f"bulk rollback of {args.adapters} adapters under probe traffic …")
            result = asyncio.run(measure(admin_url, gw_urls, key, probes, pg))
            stop_procs(procs, grace_s=10)
    finally:
        stop_procs(procs, grace_s=10)
        stop_all(sims)
        ls.flush_redis_prefix(ls.redis_server_url(), prefix)
    out: dict[str, Any] = {
        "benchmark": "bulk",
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "load_avg_before": [round(x, 2) for x in load_before],
            "load_avg_after": [round(x, 2) for x in os.getloadavg()],
            "note": "shared 2-core machine, other engineers' tests and benchmarks running",
        },
        "settings": {
            "adapters": args.adapters,
            "gateways": args.gateways,
            "replicas": args.replicas,
            "probes": probes,
            "database": "postgresql",
            "feed": "postgres LISTEN/NOTIFY",
        },
        "result": result,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=2) + "\n")
    r = result
    print()
    print(
        f"bulk rollback of {args.adapters} adapters: {r['call_wall_ms']} ms "
        f"({r['per_adapter_ms']} ms/adapter), applied {r['applied']}, failed {r['failed']}"
    )
    for g in r["gateways"]:
        print(
            f"  {g['gateway']}: table at the final revision "
            f"{g['table_at_final_from_call_start_ms']} ms after the call started "
            f"({g['table_at_final_after_answer_ms']} ms after its answer); all probes on v1 "
            f"{g['all_probes_v1_from_call_start_ms']} ms ({g['all_probes_v1_after_answer_ms']} ms after); "
            f"whole reloads {g['whole_reloads']}, incremental applies {g['incremental_applies']} "
            f"({g['changes_applied']} revisions), gaps {g['gaps']}"
        )
    print(
        f"requests during {r['requests_during']}, failed {r['failed_requests_during']}; load avg "
        f"{out['machine']['load_avg_before']} → {out['machine']['load_avg_after']}"
    )
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
