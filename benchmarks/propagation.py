"""Propagation benchmark: how long a registry change takes to be served by every gateway.

Set-up: PostgreSQL (a fresh database, ``LISTEN/NOTIFY`` change feed), Redis (a fresh key
prefix), ``--replicas`` simulator replicas (zero latency), one ``loraplane serve --role
registry`` process (the admin API) and ``--gateways`` ``loraplane serve --role gateway``
processes, all real processes; artifacts on the local disk they share. One adapter with two
versions, both made resident on the replicas before measuring, in a registry of realistic size
(``--registry-adapters`` other adapters with three versions each and ``--registry-tenants``
tenants with a key and 20 grants each; default 1,000 and 200), so that reloading the whole
table per change costs what it would in production.

Load: steady traffic through every gateway (``--concurrency`` closed-loop connections per
gateway, chat completions for ``demo-base:flip``, ``max_tokens`` 1). Meanwhile ``--flips``
promote/rollback flips (promote v2, rollback to v1, …), one at a time: after the admin API
answers, wait until every gateway has answered a request with the new
``x-loraplane-adapter-version``, then pause ``--gap-ms`` (random 0.5-1.5×) before the next.

Per flip and gateway: the time from the admin API's answer (received by this client) to the
first answer of that gateway carrying the new version (0 if one came even before the admin
answer). Reported: p50/p99/max over all (flip, gateway) pairs and of the slowest gateway per
flip, requests and failed requests (any non-200 or error) during the flips, and where the
time goes, read from each gateway's ``/readyz`` after the flip (``routing_table``): notice
delivery (admin answer → the gateway heard of it; negative when the notice, sent at commit,
arrived before the admin API's HTTP answer), apply (heard → new snapshot installed), and
how many whole reloads vs incremental applies each gateway made. ``uptime``'s load average is
recorded: on a shared machine the tail follows the load.

    .venv/bin/python benchmarks/propagation.py [--flips 200] [--gateways 3] [--concurrency 2]

``--snapshot-verify-s S`` sets the gateways' whole-reload period (``LORAPLANE_SNAPSHOT_VERIFY_S``,
default 300 s; 15 makes them reload the whole table every 15 s, as the safety net once did).

``--server-root DIR`` runs the registry and gateway processes from another checkout (e.g. an
older commit for a before/after comparison); the client stays this one.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import uvloop

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from kit import localservices as ls  # noqa: E402
from kit.procs import ManagedProcess, http_ready, wait_all_ready  # noqa: E402
from kit.procs import stop_all as stop_procs  # noqa: E402
from registry.adapter_factory import write_adapter  # noqa: E402
from registry.admin_client import AdminClient  # noqa: E402
from registry.demo import demo_base_model  # noqa: E402

TOKEN = "bench-admin-token-0123456789"
ADAPTER = "flip"
MODEL = f"demo-base:{ADAPTER}"
MSG = [{"role": "user", "content": "hi"}]
VERSION_HEADER = "x-loraplane-adapter-version"


def log(msg: str) -> None:
    print(f"[propagation] {msg}", file=sys.stderr, flush=True)


@dataclass
class Answer:
    sent: float  # time.perf_counter()
    received: float
    status: int  # 0: connection error
    version: str | None


@dataclass
class GatewayLoad:
    url: str
    answers: list[Answer] = field(default_factory=list)
    first_new: dict[str, float] = field(default_factory=dict)  # version → received, reset per flip
    watching: str | None = None
    seen: asyncio.Event = field(default_factory=asyncio.Event)


async def drive(gw: GatewayLoad, key: str, session: aiohttp.ClientSession, stop: asyncio.Event) -> None:
    body = {"model": MODEL, "messages": MSG, "max_tokens": 1}
    headers = {"authorization": f"Bearer {key}"}
    while not stop.is_set():
        t0 = time.perf_counter()
        try:
            async with session.post(f"{gw.url}/v1/chat/completions", json=body, headers=headers) as r:
                await r.read()
                status, version = r.status, r.headers.get(VERSION_HEADER)
        except (aiohttp.ClientError, TimeoutError):
            status, version = 0, None
        t1 = time.perf_counter()
        gw.answers.append(Answer(t0, t1, status, version))
        if status != 200:
            await asyncio.sleep(0.01)
        elif gw.watching is not None and version == gw.watching and not gw.seen.is_set():
            gw.first_new[version] = t1
            gw.seen.set()


def pct(xs: list[float], p: float) -> float | None:
    if not xs:
        return None
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, round(p / 100 * len(s) + 0.5) - 1))]


def ms(x: float | None) -> float | None:
    return None if x is None else round(x * 1000, 2)


# each gateway's URL → its internal port's (SPEC §19: the routing table's whole status is there)
INTERNAL_URLS: dict[str, str] = {}


async def table_status(session: aiohttp.ClientSession, url: str) -> dict[str, Any]:
    async with session.get(f"{INTERNAL_URLS.get(url, url)}/readyz") as r:
        body = await r.json()
    table = body.get("routing_table") or {}
    return table if isinstance(table, dict) else {}


async def run_flips(
    admin_url: str, gw_urls: list[str], key: str, flips: int, concurrency: int, gap_ms: float
) -> dict[str, Any]:
    loads = [GatewayLoad(u) for u in gw_urls]
    stop = asyncio.Event()
    conn = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=30)
    async with aiohttp.ClientSession(connector=conn, timeout=timeout) as session:
        workers = [
            asyncio.create_task(drive(gw, key, session, stop)) for gw in loads for _ in range(concurrency)
        ]
        admin_headers = {"authorization": f"Bearer {TOKEN}"}
        before = [await table_status(session, u) for u in gw_urls]
        await asyncio.sleep(1.0)  # steady traffic before the first flip
        per_pair: list[float] = []
        per_flip: list[float] = []
        notice: list[float] = []
        apply: list[float] = []
        timeouts = 0
        early = 0
        t_start = time.perf_counter()
        for i in range(flips):
            new = "v2" if i % 2 == 0 else "v1"
            for gw in loads:
                gw.seen.clear()
                gw.watching = new
            path = f"/admin/v1/adapters/{ADAPTER}/" + ("versions/v2/promote" if new == "v2" else "rollback")
            async with session.post(f"{admin_url}{path}", headers=admin_headers) as r:
                await r.read()
                answered, answered_wall = time.perf_counter(), time.time()
                if r.status != 200:
                    raise RuntimeError(f"flip {i}: admin answered {r.status}: {await r.text()}")
            lat: list[float] = []
            for gw in loads:
                try:
                    async with asyncio.timeout(10):
                        await gw.seen.wait()
                except TimeoutError:
                    timeouts += 1
                    continue
                d = gw.first_new[new] - answered
                early += d < 0
                lat.append(max(0.0, d))
            for gw in loads:
                gw.watching = None
            per_pair += lat
            if len(lat) == len(loads):
                per_flip.append(max(lat))
            for u in gw_urls:  # where the time went (the table's own clocks, same machine)
                st = await table_status(session, u)
                if st.get("notified_at") and st.get("changed_at"):
                    notice.append(st["notified_at"] - answered_wall)  # < 0: heard before the answer
                    apply.append(max(0.0, st["changed_at"] - st["notified_at"]))
            await asyncio.sleep(gap_ms / 1000 * random.uniform(0.5, 1.5))
        t_end = time.perf_counter()
        after = [await table_status(session, u) for u in gw_urls]
        stop.set()
        await asyncio.gather(*workers, return_exceptions=True)
    during = [a for gw in loads for a in gw.answers if t_start <= a.sent <= t_end]
    failed = [a for a in during if a.status != 200]
    tables = []
    for u, b, a in zip(gw_urls, before, after, strict=True):
        tables.append(
            {
                "gateway": u,
                "whole_reloads": _delta(a, b, "reloads"),
                "incremental_applies": _delta(a, b, "applies"),
                "gaps": _delta(a, b, "gaps"),
                "safety_net_loads": _delta(a, b, "refreshes"),
                "safety_net_outrun": _delta(a, b, "refreshes_outrun"),
                "revision_checks": _delta(a, b, "revision_checks"),
                "missed_notices": _delta(a, b, "missed"),
                "last_apply_ms": a.get("apply_ms"),
                "last_whole_load_ms": a.get("load_ms"),
            }
        )
    return {
        "flips": flips,
        "pairs": len(per_pair),
        "timeouts": timeouts,
        "answered_before_admin": early,
        "p50_ms": ms(pct(per_pair, 50)),
        "p99_ms": ms(pct(per_pair, 99)),
        "max_ms": ms(max(per_pair) if per_pair else None),
        "slowest_gateway_p50_ms": ms(pct(per_flip, 50)),
        "slowest_gateway_p99_ms": ms(pct(per_flip, 99)),
        "notice_p50_ms": ms(pct(notice, 50)),
        "notice_p99_ms": ms(pct(notice, 99)),
        "apply_p50_ms": ms(pct(apply, 50)),
        "apply_p99_ms": ms(pct(apply, 99)),
        "requests_during_flips": len(during),
        "failed_during_flips": len(failed),
        "failed_statuses": sorted({a.status for a in failed}),
        "request_p50_ms": ms(pct([a.received - a.sent for a in during], 50)),
        "seconds": round(t_end - t_start, 2),
        "tables": tables,
        "latencies_ms": [ms(x) for x in per_pair],
    }


def _delta(a: dict[str, Any], b: dict[str, Any], k: str) -> int | None:
    if not isinstance(a.get(k), int) or not isinstance(b.get(k), int):
        return None
    return int(a[k]) - int(b[k])


def platform_env(
    work: Path, pg: str, redis_prefix: str, sims: list[str], server_root: Path
) -> dict[str, str]:
    env = {
        **os.environ,
        "PYTHONPATH": str(server_root),
        "LORAPLANE_DATABASE_URL": pg,
        "LORAPLANE_REDIS_URL": ls.redis_server_url(),
        "LORAPLANE_REDIS_PREFIX": redis_prefix,
        "LORAPLANE_ADMIN_TOKEN": TOKEN,
        "LORAPLANE_DATA_DIR": str(work / "data"),
        "LORAPLANE_STAGING_DIR": str(work / "staging"),
        "LORAPLANE_ADMIN_PORT": str(ls.free_port()),
        "LORAPLANE_POOLS": json.dumps(
            [{"name": "sim", "base_model": "demo-base", "urls": sims, "max_loras": 4, "max_adapters": 8}]
        ),
        "LORAPLANE_LOG_LEVEL": "WARNING",
    }
    for k in ("LORAPLANE_S3_BUCKET", "LORAPLANE_S3_ENDPOINT_URL"):
        env.pop(k, None)
    return env


CLI = [sys.executable, "-m", "loraplane.cli"]


def start_registry(work: Path, env: dict[str, str], server_root: Path) -> tuple[ManagedProcess, str]:
    # the schema of the code that serves (``--server-root`` may be another checkout)
    subprocess.run([*CLI, "db", "upgrade"], env=env, cwd=server_root, check=True)
    proc = ManagedProcess(
        [*CLI, "serve", "--role", "registry"],
        env=env,
        cwd=server_root,
        log_path=work / "registry.log",
        name="registry",
    ).start()
    admin_url = f"http://127.0.0.1:{env['LORAPLANE_ADMIN_PORT']}"
    proc.wait_ready(http_ready(f"{admin_url}/admin/v1/healthz"), 120)
    return proc, admin_url


def start_gateways(
    work: Path, env: dict[str, str], server_root: Path, n: int
) -> tuple[list[ManagedProcess], list[str]]:
    procs, urls = [], []
    for i in range(n):
        port, internal = ls.free_port(), ls.free_port()
        INTERNAL_URLS[f"http://127.0.0.1:{port}"] = f"http://127.0.0.1:{internal}"
        procs.append(
            ManagedProcess(
                [*CLI, "serve", "--role", "gateway"],
                env={
                    **env,
                    "LORAPLANE_GATEWAY_PORT": str(port),
                    "LORAPLANE_GATEWAY_INTERNAL_PORT": str(internal),
                },
                cwd=server_root,
                log_path=work / f"gateway-{i}.log",
                name=f"gateway-{i}",
            ).start()
        )
        urls.append(f"http://127.0.0.1:{port}")
    wait_all_ready([(p, http_ready(f"{u}/readyz")) for p, u in zip(procs, urls, strict=True)], 180)
    return procs, urls


def fill_registry(pg: str, adapters: int, tenants: int) -> None:
    """A registry of realistic size around the flipped adapter: ``adapters`` adapters with three
    versions each (v2 active), ``tenants`` tenants with a key and grants on 20 adapters each.
    Written with plain SQL (fast, and the same on an older schema); never served."""
    import psycopg

    from registry.feed import libpq_dsn

    files = json.dumps([{"name": "adapter_model.safetensors", "size": 1 << 20, "sha256": "0" * 64}])
    with psycopg.connect(libpq_dsn(pg)) as conn, conn.cursor() as cur:
        ids = [f"fill-{i:05d}" for i in range(adapters)]
        cur.executemany(
            "INSERT INTO adapters (id, base_model, owner, status, active_version, hot, created_at) "
            "VALUES (%s, 'demo-base', 'fill', 'active', 2, false, now())",
            [(a,) for a in ids],
        )
        cur.executemany(
            "INSERT INTO versions (adapter_id, number, status, rank, lora_alpha, target_modules, files, "
            "storage_uri, quality_gate, created_by, created_at) "
            "VALUES (%s, %s, %s, 8, 16, '[\"q_proj\", \"v_proj\"]', %s, %s, 'skipped', 'bench', now())",
            [
                (a, n, {1: "retired", 2: "active", 3: "ready"}[n], files, f"file:///nowhere/{a}/{n}/")
                for a in ids
                for n in (1, 2, 3)
            ],
        )
        tids = [f"fill-t{i:04d}" for i in range(tenants)]
        cur.executemany(
            "INSERT INTO tenants (id, name, rpm, base_model_access, created_at) "
            "VALUES (%s, %s, 600, false, now())",
            [(t, t) for t in tids],
        )
        cur.executemany(
            "INSERT INTO api_keys (key_id, tenant_id, prefix, key_hash, created_at) "
            "VALUES (%s, %s, %s, %s, now())",
            [(f"k-{t}", t, f"lp-{i:06d}", f"{i:064x}") for i, t in enumerate(tids)],
        )
        cur.executemany(
            "INSERT INTO grants (tenant_id, adapter_id) VALUES (%s, %s)",
            [(t, ids[(i * 20 + j) % len(ids)]) for i, t in enumerate(tids) for j in range(min(20, len(ids)))],
        )
        cur.execute("UPDATE registry_state SET revision = revision + 1 WHERE id = 1")


def seed(admin_url: str, work: Path) -> str:
    with AdminClient(admin_url, TOKEN) as a:
        spec = demo_base_model()
        a.create_base_model(
            spec["name"], spec["hf_id"], spec["max_lora_rank"], spec["target_modules"], spec["module_shapes"]
        )
        a.create_adapter(ADAPTER, "demo-base")
        for seed_ in (1, 2):
            d = work / "src" / f"v{seed_}"
            write_adapter(d, seed=seed_, rank=8, target_modules=("q_proj", "v_proj"))
            a.upload_version(ADAPTER, d)
        a.promote(ADAPTER, "v1")
        a.create_tenant(
            "bench", limits={"rpm": 100_000_000, "tpm": 2_000_000_000, "max_concurrency": 100_000}
        )
        a.put_grant("bench", ADAPTER)
        return str(a.issue_key("bench")["key"])


async def warm(admin_url: str, gw_urls: list[str], key: str) -> None:
    """Both versions resident, every gateway serving v1, before measuring."""
    headers = {"authorization": f"Bearer {key}"}
    admin = {"authorization": f"Bearer {TOKEN}"}
    body = {"model": MODEL, "messages": MSG, "max_tokens": 1}
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as s:

        async def until(version: str) -> None:
            for u in gw_urls:
                for _ in range(600):
                    async with s.post(f"{u}/v1/chat/completions", json=body, headers=headers) as r:
                        await r.read()
                        if r.status == 200 and r.headers.get(VERSION_HEADER) == version:
                            break
                    await asyncio.sleep(0.05)
                else:
                    raise RuntimeError(f"{u} never served {version}")

        await until("v1")
        async with s.post(f"{admin_url}/admin/v1/adapters/{ADAPTER}/versions/v2/promote", headers=admin) as r:
            assert r.status == 200, await r.text()
        await until("v2")
        async with s.post(f"{admin_url}/admin/v1/adapters/{ADAPTER}/rollback", headers=admin) as r:
            assert r.status == 200, await r.text()
        await until("v1")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--flips", type=int, default=200)
    ap.add_argument("--gateways", type=int, default=3)
    ap.add_argument("--replicas", type=int, default=2)
    ap.add_argument("--concurrency", type=int, default=2, help="connections per gateway")
    ap.add_argument("--gap-ms", type=float, default=100.0, help="mean pause between flips")
    ap.add_argument("--registry-adapters", type=int, default=1000, help="other adapters in the registry")
    ap.add_argument("--registry-tenants", type=int, default=200, help="other tenants (key + 20 grants each)")
    ap.add_argument(
        "--snapshot-verify-s",
        type=float,
        default=None,
        help="the gateways' LORAPLANE_SNAPSHOT_VERIFY_S (whole reload period; default: theirs, 300 s)",
    )
    ap.add_argument("--server-root", default=str(ROOT))
    ap.add_argument("--label", default="")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "propagation.json"))
    args = ap.parse_args()
    from simulator.procs import start_simulators, stop_all

    server_root = Path(args.server_root).resolve()
    work = Path(tempfile.mkdtemp(prefix="lp-bench-prop-"))
    prefix = ls.unique_redis_prefix("benchprop")
    load_before = os.getloadavg()
    procs: list[ManagedProcess] = []
    sims = start_simulators(args.replicas, extra_args=["--zero-latency", "--max-loras", "4"])
    try:
        with ls.temp_pg_database("benchprop") as pg:
            env = platform_env(work, pg, prefix, [p.url for p in sims], server_root)
            if args.snapshot_verify_s is not None:
                env["LORAPLANE_SNAPSHOT_VERIFY_S"] = str(args.snapshot_verify_s)
            reg, admin_url = start_registry(work, env, server_root)
            procs.append(reg)
            key = seed(admin_url, work)
            if args.registry_adapters:
                fill_registry(pg, args.registry_adapters, args.registry_tenants)
            gws, gw_urls = start_gateways(work, env, server_root, args.gateways)
            procs += gws
            log(f"{args.gateways} gateways ready; warming both versions …")
            uvloop.run(warm(admin_url, gw_urls, key))
            log(f"{args.flips} flips under steady traffic ({args.concurrency} connections per gateway) …")
            result = uvloop.run(  # the client's own loop costs less CPU on a shared machine
                run_flips(admin_url, gw_urls, key, args.flips, args.concurrency, args.gap_ms)
            )
            stop_procs(procs, grace_s=10)
    finally:
        stop_procs(procs, grace_s=10)
        stop_all(sims)
        ls.flush_redis_prefix(ls.redis_server_url(), prefix)
    out = {
        "benchmark": "propagation",
        "label": args.label,
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "load_avg_before": [round(x, 2) for x in load_before],
            "load_avg_after": [round(x, 2) for x in os.getloadavg()],
        },
        "settings": {
            "gateways": args.gateways,
            "replicas": args.replicas,
            "concurrency_per_gateway": args.concurrency,
            "flips": args.flips,
            "gap_ms": args.gap_ms,
            "registry_adapters": args.registry_adapters,
            "registry_tenants": args.registry_tenants,
            "feed": "postgres LISTEN/NOTIFY",
            "snapshot_verify_s": args.snapshot_verify_s,
            "server_root": "the checkout" if server_root == ROOT.resolve() else server_root.name,
        },
        "result": result,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=2) + "\n")
    r = result
    print()
    print(f"{'':<28}{'p50 ms':>9}{'p99 ms':>9}{'max ms':>9}")
    print(f"{'per (flip, gateway)':<28}{r['p50_ms']!s:>9}{r['p99_ms']!s:>9}{r['max_ms']!s:>9}")
    slow = (r["slowest_gateway_p50_ms"], r["slowest_gateway_p99_ms"])
    print(f"{'slowest gateway per flip':<28}{slow[0]!s:>9}{slow[1]!s:>9}")
    print(f"{'notice (admin → heard)':<28}{r['notice_p50_ms']!s:>9}{r['notice_p99_ms']!s:>9}")
    print(f"{'apply (heard → installed)':<28}{r['apply_p50_ms']!s:>9}{r['apply_p99_ms']!s:>9}")
    print(
        f"\nflips {r['flips']}, pairs {r['pairs']}, timeouts {r['timeouts']}; requests during flips "
        f"{r['requests_during_flips']}, failed {r['failed_during_flips']} {r['failed_statuses']}; "
        f"request p50 {r['request_p50_ms']} ms; load avg {out['machine']['load_avg_before']} → "
        f"{out['machine']['load_avg_after']}"
    )
    for t in r["tables"]:
        print(
            f"  {t['gateway']}: whole reloads {t['whole_reloads']}, incremental applies "
            f"{t['incremental_applies']}, gaps {t['gaps']}, safety-net loads {t['safety_net_loads']} "
            f"({t['safety_net_outrun']} outrun by changes), revision checks {t['revision_checks']} "
            f"(missed notices {t['missed_notices']}), last apply {t['last_apply_ms']} ms"
        )
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
