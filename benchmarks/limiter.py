"""Limiter round trips: what one admission and one settlement cost a request at one connection.

One request at a time from one uvloop client (a gateway at one connection waits for each of
these in turn), against the Redis the gateway uses (``$LORAPLANE_REDIS_URL``, else the machine's
or one of ``kit.localservices``):

- ``blocking socket PING``: a bare socket, ``sendall`` then ``recv`` (the floor of a loopback
  round trip on this machine);
- ``pipeline PING``: the same command through the limiter's own connection
  (``gateway.ratelimit.autopipe``);
- ``pipeline EVAL return 1``: the cheapest script call;
- ``admit()`` / ``settle()``: ``RedisLimiter`` with a tenant plan of rpm, tpm and
  ``max_concurrency`` (the gateway benchmark's tenant): two script calls per request.

Per row: p50 / p99 wall time per call, and for script rows the time Redis itself spent per call
(``INFO commandstats``, ``usec_per_call`` of the calls made during the row). Prints a table and
writes ``benchmarks/results/limiter.json``::

    .venv/bin/python benchmarks/limiter.py --calls 3000
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT.parent))

import redis as syncredis  # noqa: E402
import redis.asyncio as aioredis  # noqa: E402
import uvloop  # noqa: E402

from gateway.ratelimit.autopipe import AutoPipeline  # noqa: E402
from gateway.ratelimit.base import make_plan  # noqa: E402
from gateway.ratelimit.redis_limiter import RedisLimiter  # noqa: E402
from kit import localservices as ls  # noqa: E402


def script_usec(r: syncredis.Redis) -> tuple[int, int]:
    """(calls, usec) of EVAL + EVALSHA so far."""
    stats: dict[str, Any] = r.info("commandstats")  # type: ignore[assignment]
    calls = usec = 0
    for cmd in ("cmdstat_eval", "cmdstat_evalsha"):
        s = stats.get(cmd)
        if s:
            calls += int(s["calls"])
            usec += int(s["usec"])
    return calls, usec


def row(name: str, lat: list[float], redis_us: float | None) -> dict[str, Any]:
    lat = sorted(lat)
    return {
        "call": name,
        "p50_us": round(statistics.median(lat) * 1e6, 1),
        "p99_us": round(lat[min(len(lat) - 1, int(0.99 * len(lat)))] * 1e6, 1),
        "redis_us_per_call": None if redis_us is None else round(redis_us, 1),
        "calls": len(lat),
    }


async def timed(n: int, call: Callable[[], Awaitable[Any]], warmup: int) -> list[float]:
    out = []
    for i in range(n + warmup):
        t0 = time.perf_counter()
        await call()
        if i >= warmup:
            out.append(time.perf_counter() - t0)
    return out


async def run(url: str, prefix: str, n: int) -> list[dict[str, Any]]:
    sync = syncredis.Redis.from_url(url)
    rows: list[dict[str, Any]] = []
    warm = max(100, n // 10)

    parts = urlsplit(url)
    sock = socket.create_connection((parts.hostname or "127.0.0.1", parts.port or 6379))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    if parts.password:
        sock.sendall(f"AUTH {parts.password}\r\n".encode())
        sock.recv(64)
    lat = []
    for i in range(n + warm):
        t0 = time.perf_counter()
        sock.sendall(b"PING\r\n")
        sock.recv(64)
        if i >= warm:
            lat.append(time.perf_counter() - t0)
    sock.close()
    rows.append(row("blocking socket PING", lat, None))

    pipe = AutoPipeline(aioredis.Redis.from_url(url), timeout_s=5)
    rows.append(row("pipeline PING", await timed(n, lambda: pipe.execute("PING"), warm), None))
    c0 = script_usec(sync)
    lat = await timed(n, lambda: pipe.execute("EVAL", "return 1", 0), warm)
    c1 = script_usec(sync)
    rows.append(row("pipeline EVAL return 1", lat, (c1[1] - c0[1]) / max(1, c1[0] - c0[0])))
    await pipe.aclose()

    lim = RedisLimiter(aioredis.Redis.from_url(url), prefix=prefix, lease_s=30, timeout_s=5)
    plan = make_plan(
        tenant_id="bench", rpm=100_000_000, tpm=2_000_000_000, max_concurrency=100_000, estimated_tokens=40
    )
    admit_lat, settle_lat = [], []
    for i in range(n + warm):  # timed: nothing else between the calls
        t0 = time.perf_counter()
        res = await lim.admit(plan)
        t1 = time.perf_counter()
        assert res.admitted and res.lease is not None
        await lim.settle(res.lease, 27)
        t2 = time.perf_counter()
        if i >= warm:
            admit_lat.append(t1 - t0)
            settle_lat.append(t2 - t1)
    admit_us = settle_us = 0
    for _ in range(n):  # Redis's own time per script, read between the calls (not timed)
        a0 = script_usec(sync)
        res = await lim.admit(plan)
        a1 = script_usec(sync)
        assert res.lease is not None
        await lim.settle(res.lease, 27)
        s1 = script_usec(sync)
        admit_us += a1[1] - a0[1]
        settle_us += s1[1] - a1[1]
    await lim.close()
    rows.append(row("admit() (rpm, tpm, concurrency)", admit_lat, admit_us / n))
    rows.append(row("settle() (tpm correction, slot)", settle_lat, settle_us / n))
    keys = list(sync.scan_iter(prefix + "*"))
    if keys:
        sync.delete(*keys)
    sync.close()
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, default=3000, help="measured calls per row (after a warm-up)")
    ap.add_argument("--out", default=str(ROOT / "results" / "limiter.json"))
    args = ap.parse_args()
    url = os.environ.get("LORAPLANE_REDIS_URL") or ls.redis_server_url()
    prefix = ls.unique_redis_prefix("bench-limiter")
    la0 = [round(x, 2) for x in os.getloadavg()]
    rows = uvloop.run(run(url, prefix, args.calls))
    la1 = [round(x, 2) for x in os.getloadavg()]
    print(f"{'call':<36}{'p50 µs':>9}{'p99 µs':>9}{'in Redis µs':>13}")
    for r in rows:
        inside = "-" if r["redis_us_per_call"] is None else f"{r['redis_us_per_call']:.1f}"
        print(f"{r['call']:<36}{r['p50_us']:>9.1f}{r['p99_us']:>9.1f}{inside:>13}")
    print(f"load average at start {la0}, at end {la1} ({os.cpu_count()} CPUs)")
    out = {
        "benchmark": "limiter",
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": {"cpus": os.cpu_count(), "load_avg_start": la0, "load_avg_end": la1},
        "calls_per_row": args.calls,
        "rows": rows,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
