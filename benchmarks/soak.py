"""Soak benchmark (issue 13): ten minutes of mixed traffic with churn through two gateways, and
whether every process stays flat.

Set-up: ``tests/gateway/gw_platform.run_platform`` — a fresh PostgreSQL database, a Redis key
prefix, the S3 server (SeaweedFS, ``kit.localservices.start_s3_server``), three simulator
replicas, one ``loraplane serve --role registry`` and two ``loraplane serve --role gateway``
processes, all real processes. ``--adapters`` adapters (default 32, one version each, promoted)
on a pool of ``max_loras`` 4 / ``max_adapters`` 8 per replica: 24 places for 32 adapters plus
every new version, so the router loads and evicts all the time.

Traffic (aiohttp, closed loop, ``--concurrency`` connections split over both gateways):
chat completions, half of them streamed (some with ``stream_options.include_usage``, some with
a ``user`` for sticky canaries), adapters drawn Zipf-like from each tenant's grants; tenants
``alpha`` (every adapter) and ``beta`` (every other one), both unlimited, and ``tight``
(``rpm`` 120, ``max_concurrency`` 2, four adapters, paced at ``--tight-rps``) whose 429s are
the designed error this run exercises on purpose.

Churn (admin API, one thread, one operation every ``--churn-every-s`` on average): upload a new
version, promote a ready version, make one a canary (10/25/50 %), roll back, mark an adapter hot
or unmark one (at most three hot), prewarm (``POST …/prewarm``). Evictions come from the
traffic (more adapters than places); they are counted from the gateways' ``/metrics``.

Classified per request: ``ok`` (200 with a body, or a stream that ended with ``[DONE]`` and no
error event); designed errors (429 ``rate_limit_exceeded``, 503 ``no_capacity`` /
``adapter_load_failed``, a stream that ended with an error event and ``[DONE]``), counted by
code; unexpected: any other status (500, 502, 504, 404, …), a connection error, a client
timeout (``--request-timeout-s``, a hang), a stream that ended without ``[DONE]``, a 200 without
content. Every process (the registry, each gateway, each simulator, the S3 server; not the
shared PostgreSQL/Redis) is sampled every ``--sample-every-s``: ``VmRSS`` and open file
descriptors summed over its session (its children included), threads; named samples after the
warm-up (start), half-way (middle) and at the end. "Flat": RSS growth start → end at most
``max(20 MB, 10 %)`` and FD growth at most 5. Also recorded: each gateway's ``/metrics`` size,
the staging directory's size, the most adapters any replica had registered (SPEC §17: at most
``max_adapters``), loads/unloads/placements from ``/metrics``, audit actions, and ERROR lines
of every log. The machine may be shared: the load average is sampled through the run.

    .venv/bin/python benchmarks/soak.py [--duration-s 600] [--warmup-s 45] [--concurrency 8]

Writes ``benchmarks/results/soak.json`` (``--out``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import random
import re
import shutil
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import httpx
import orjson
import uvloop
from prometheus_client.parser import text_string_to_metric_families
from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from kit import localservices as ls  # noqa: E402
from registry.adapter_factory import write_adapter  # noqa: E402
from registry.admin_client import AdminAPIError, AdminClient, AdminUnreachable  # noqa: E402
from tests.gateway.gw_platform import ADMIN_TOKEN, Platform, run_platform  # noqa: E402

BASE = "demo-base"
MAX_LORAS, MAX_ADAPTERS = 4, 8
DESIGNED = {(429, "rate_limit_exceeded"), (503, "no_capacity"), (503, "adapter_load_failed")}
TIGHT_WORKERS = 3
RSS_FLAT_MB, RSS_FLAT_PCT, FD_FLAT = 20.0, 10.0, 5
FLAT_RULE = f"RSS growth start→end ≤ max({RSS_FLAT_MB:.0f} MB, {RSS_FLAT_PCT:.0f} %), FD growth ≤ {FD_FLAT}"
console = Console(stderr=False, width=150)


def log(msg: str) -> None:
    print(f"[soak {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def pct(xs: list[float], p: float) -> float | None:
    if not xs:
        return None
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, round(p / 100 * len(s) + 0.5) - 1))]


# --------------------------------------------------------------------------- processes


def _stat_fields(pid: int) -> list[str]:
    raw = Path(f"/proc/{pid}/stat").read_text()
    return raw[raw.rindex(")") + 2 :].split()  # state ppid pgrp session …


def session_pids(leader: int) -> list[int]:
    """Every live process of ``leader``'s session (ManagedProcess starts each in its own)."""
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if int(_stat_fields(int(d.name))[3]) == leader:
                    out.append(int(d.name))
            except (OSError, ValueError, IndexError):
                continue
    return out or [leader]


_TICK = os.sysconf("SC_CLK_TCK")
_TCP_STATES = {"01": "", "06": "TIME_WAIT", "08": "CLOSE_WAIT", "0A": "LISTEN"}


def _sockets(pid: int, ports: dict[int, str]) -> dict[str, str]:
    """Socket inode → what it is: ``listen``, ``in:<server>`` (a connection to one of the
    platform's servers, seen from that server), ``out:<server>``, ``tcp:other``, ``unix``;
    ``CLOSE_WAIT`` sockets (the peer closed, this side did not) are marked."""
    out: dict[str, str] = {}
    for table in ("tcp", "tcp6"):
        try:
            lines = Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]
        except OSError:
            continue
        for ln in lines:
            f = ln.split()
            lport, rport, state = int(f[1].rsplit(":", 1)[1], 16), int(f[2].rsplit(":", 1)[1], 16), f[3]
            st = _TCP_STATES.get(state, state)
            if st == "LISTEN":
                label = "listen"
            elif lport in ports and rport not in ports:
                label = f"in:{ports[lport]}"
            elif rport in ports:
                label = f"out:{ports[rport]}"
            else:
                label = "tcp:other"
            out[f[9]] = label + (f" {st}" if st in ("CLOSE_WAIT", "TIME_WAIT") else "")
    with contextlib.suppress(OSError):
        for ln in Path(f"/proc/{pid}/net/unix").read_text().splitlines()[1:]:
            f = ln.split()
            if len(f) >= 7:
                out.setdefault(f[6], "unix")
    return out


def proc_usage(leader: int, ports: dict[int, str] | None = None) -> dict[str, Any]:
    """RSS, open FDs (by kind when ``ports`` is given), threads and CPU seconds of ``leader``'s
    session (the process and its children)."""
    rss_kb = fds = threads = 0
    cpu = 0.0
    kinds: Counter[str] = Counter()
    pids = session_pids(leader)
    for pid in pids:
        try:
            status = Path(f"/proc/{pid}/status").read_text()
            rss_kb += int(re.search(r"^VmRSS:\s+(\d+)", status, re.M).group(1))  # type: ignore[union-attr]
            threads += int(re.search(r"^Threads:\s+(\d+)", status, re.M).group(1))  # type: ignore[union-attr]
            st = _stat_fields(pid)
            cpu += (int(st[11]) + int(st[12])) / _TICK
            names = os.listdir(f"/proc/{pid}/fd")
            fds += len(names)
            if ports is not None:
                socks = _sockets(pid, ports)
                for n in names:
                    with contextlib.suppress(OSError):
                        link = os.readlink(f"/proc/{pid}/fd/{n}")
                        if link.startswith("socket:["):
                            kinds[socks.get(link[8:-1], "socket:other")] += 1
                        elif link.startswith(("pipe:", "anon_inode:")):
                            kinds[link.split("[")[0].rstrip(":")] += 1
                        elif link.startswith("/dev/"):
                            kinds["dev"] += 1
                        else:
                            kinds["file"] += 1
        except (OSError, AttributeError, IndexError, ValueError):
            continue
    out: dict[str, Any] = {
        "rss_mb": round(rss_kb / 1024, 1),
        "fds": fds,
        "threads": threads,
        "procs": len(pids),
        "cpu_s": round(cpu, 2),
    }
    if ports is not None:
        out["fd_kinds"] = dict(sorted(kinds.items()))
    return out


def dir_bytes(path: Path) -> int:
    total = 0
    for dirpath, _, files in os.walk(path):
        for f in files:
            try:
                total += os.lstat(os.path.join(dirpath, f)).st_size
            except OSError:
                continue
    return total


@dataclass
class Sampler:
    procs: dict[str, int]  # name → session leader pid
    ports: dict[int, str]  # the platform's listening ports → server name (to tell sockets apart)
    gateway_urls: list[str]  # their internal ports (/metrics, SPEC §19)
    staging: Path
    samples: list[dict[str, Any]] = field(default_factory=list)
    t0: float = field(default_factory=time.monotonic)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def take(self, label: str = "") -> dict[str, Any]:
        s: dict[str, Any] = {
            "t_s": round(time.monotonic() - self.t0, 1),
            "label": label,
            "load_avg": [round(x, 2) for x in os.getloadavg()],
            "procs": {name: proc_usage(pid, self.ports) for name, pid in self.procs.items()},
            "staging_mb": round(dir_bytes(self.staging) / 2**20, 2),
            "metrics_kb": {},
        }
        for i, u in enumerate(self.gateway_urls):
            try:
                s["metrics_kb"][f"gateway-{i + 1}"] = round(
                    len(httpx.get(f"{u}/metrics", timeout=10).content) / 1024, 1
                )
            except httpx.HTTPError:
                s["metrics_kb"][f"gateway-{i + 1}"] = None
        with self.lock:
            self.samples.append(s)
        return s

    def loop(self, every_s: float, stop: threading.Event) -> None:
        while not stop.wait(every_s):
            self.take()


# --------------------------------------------------------------------------- traffic


@dataclass
class Outcome:
    t: float
    phase: str
    gateway: int
    tenant: str
    stream: bool
    status: int  # 0: no HTTP answer
    code: str  # ok | an error code | a client-side failure
    seconds: float
    unexpected: bool
    detail: str = ""
    rid: str = ""


@dataclass
class Traffic:
    gateway_urls: list[str]
    keys: dict[str, str]
    grants: dict[str, list[str]]
    max_tokens: int
    stream_fraction: float
    request_timeout_s: float
    phase: str = "warmup"
    outcomes: list[Outcome] = field(default_factory=list)

    def pick(self, rng: random.Random, tenant: str) -> str:
        ids = self.grants[tenant]
        weights = [1.0 / (i + 1) ** 1.1 for i in range(len(ids))]  # Zipf-like: a few hot, a long tail
        return rng.choices(ids, weights)[0]

    async def one(self, s: aiohttp.ClientSession, rng: random.Random, gw: int, tenant: str) -> None:
        stream = rng.random() < self.stream_fraction
        body: dict[str, Any] = {
            "model": f"{BASE}:{self.pick(rng, tenant)}",
            "messages": [{"role": "user", "content": f"soak {rng.randint(0, 10**6)} " * rng.randint(1, 20)}],
            "max_tokens": rng.randint(1, self.max_tokens),
            "stream": stream,
        }
        if stream and rng.random() < 0.5:
            body["stream_options"] = {"include_usage": True}
        if rng.random() < 0.3:
            body["user"] = f"user-{rng.randint(0, 49)}"
        headers = {"authorization": f"Bearer {self.keys[tenant]}"}
        phase, t0 = self.phase, time.monotonic()
        status, code, detail, rid = 0, "", "", ""
        try:
            async with s.post(
                f"{self.gateway_urls[gw]}/v1/chat/completions", json=body, headers=headers
            ) as r:
                status, rid = r.status, r.headers.get("x-request-id", "")
                if r.status != 200:
                    raw = await r.read()
                    try:
                        code = str(orjson.loads(raw)["error"]["code"])
                    except (orjson.JSONDecodeError, KeyError, TypeError):
                        code = "unparsed_error_body"
                    detail = repr(raw[:300])
                elif stream:
                    code, detail = await self._read_stream(r)
                else:
                    data = orjson.loads(await r.read())
                    ok = isinstance(data.get("choices"), list) and data["choices"]
                    code, detail = ("ok", "") if ok else ("no_choices", str(data)[:300])
        except TimeoutError:
            code = "client_timeout"
        except aiohttp.ClientError as e:
            code, detail = f"connection:{type(e).__name__}", str(e)[:300]
        except orjson.JSONDecodeError as e:
            code, detail = "bad_json", str(e)[:300]
        secs = time.monotonic() - t0
        designed = code == "ok" or (status, code) in DESIGNED or code.startswith("stream_error:")
        self.outcomes.append(
            Outcome(
                t0,
                phase,
                gw,
                tenant,
                stream,
                status,
                code,
                secs,
                not designed,
                detail if not designed else "",
                rid,
            )
        )

    @staticmethod
    async def _read_stream(r: aiohttp.ClientResponse) -> tuple[str, str]:
        done, error, chunks, after_done = False, None, 0, 0
        async for line in r.content:
            line = line.strip()
            if not line.startswith(b"data:"):
                continue
            payload = line[5:].strip()
            if done:
                after_done += 1
            elif payload == b"[DONE]":
                done = True
            else:
                obj = orjson.loads(payload)
                if isinstance(obj, dict) and isinstance(obj.get("error"), dict):
                    error = str(obj["error"].get("code"))
                else:
                    chunks += 1
        if not done:
            return "stream_truncated", f"{chunks} chunks, error event {error}"
        if after_done:
            return "data_after_done", f"{after_done} events after [DONE]"
        if error is not None:
            return f"stream_error:{error}", ""
        if chunks == 0:
            return "empty_stream", "[DONE] without a chunk"
        return "ok", ""

    async def worker(
        self, rng: random.Random, gw: int, tenant: str, stop: asyncio.Event, rps: float | None
    ) -> None:
        timeout = aiohttp.ClientTimeout(total=self.request_timeout_s)
        async with aiohttp.ClientSession(timeout=timeout, connector=aiohttp.TCPConnector(limit=0)) as s:
            while not stop.is_set():
                t = time.monotonic()
                await self.one(s, rng, gw, tenant)
                if rps:
                    await asyncio.sleep(max(0.0, 1 / rps - (time.monotonic() - t)))


# --------------------------------------------------------------------------- churn

KINDS = {"upload": 5, "promote": 2, "canary": 2, "rollback": 2, "hot": 2, "prewarm": 2}


@dataclass
class Churn:
    admin_url: str
    adapters: list[str]
    workdir: Path
    rng: random.Random
    ops: list[tuple[float, str, str, float]] = field(default_factory=list)  # (start, kind, result, s)
    failures: list[dict[str, Any]] = field(default_factory=list)
    hot: list[str] = field(default_factory=list)
    fresh: list[str] = field(default_factory=list)  # adapters given a version by this run's uploads
    promoted: list[str] = field(default_factory=list)  # … and promoted by it (likely rollback targets)
    seq: int = 1000

    def loop(self, every_s: float, stop: threading.Event) -> None:
        with AdminClient(self.admin_url, ADMIN_TOKEN, timeout=60) as admin:
            while not stop.wait(every_s * self.rng.uniform(0.5, 1.5)):
                kind = self.rng.choices(list(KINDS), list(KINDS.values()))[0]
                t0 = time.monotonic()
                try:
                    kind, result = self.do(admin, kind)
                except AdminAPIError as e:  # refused: a designed 4xx is a refusal, a 5xx a failure
                    result = f"refused:{e.code}" if e.status < 500 else f"failed:{e.status}:{e.code}"
                    if e.status >= 500:
                        self.failures.append(
                            {"kind": kind, "status": e.status, "code": e.code, "message": str(e)[:300]}
                        )
                except AdminUnreachable as e:
                    result = "failed:unreachable"
                    self.failures.append(
                        {"kind": kind, "status": 0, "code": "unreachable", "message": str(e)[:300]}
                    )
                self.ops.append((t0, kind, result, time.monotonic() - t0))

    def _ready(self, admin: AdminClient) -> tuple[str, str] | None:
        """An adapter with a ``ready`` version (the newest), looked for among recent uploads first."""
        others = self.rng.sample(self.adapters, min(4, len(self.adapters)))
        for aid in list(dict.fromkeys([*reversed(self.fresh), *others])):
            desc = admin.get_adapter(aid)
            ready = [v["version"] for v in desc.get("versions", []) if v["status"] == "ready"]
            if ready:
                return aid, max(ready, key=lambda v: int(v.lstrip("v")))
            if aid in self.fresh:
                self.fresh.remove(aid)
        return None

    def do(self, admin: AdminClient, kind: str) -> tuple[str, str]:
        aid = self.rng.choice(self.adapters)
        if kind == "upload":
            self.seq += 1
            d = self.workdir / f"churn-{self.seq}"
            write_adapter(d, seed=self.seq, rank=8, target_modules=("q_proj", "v_proj"))
            try:
                admin.upload_version(aid, d)
                self.fresh.append(aid)
            finally:
                shutil.rmtree(d, ignore_errors=True)
        elif kind in ("promote", "canary"):
            found = self._ready(admin)
            if found is None:
                return kind, "skipped:no_ready_version"
            weight = self.rng.choice([10, 25, 50]) if kind == "canary" else None
            admin.promote(found[0], found[1], canary_weight=weight)
            self.promoted.append(found[0])
        elif kind == "rollback":  # mostly one this run promoted; sometimes any (409 no_rollback_target)
            if self.promoted and self.rng.random() < 0.8:
                aid = self.promoted.pop(self.rng.randrange(len(self.promoted)))
            admin.rollback(aid)
        elif kind == "hot":
            if len(self.hot) >= 3:
                admin.update_adapter(self.hot.pop(0), hot=False)
                return "unhot", "ok"
            aid = self.rng.choice([a for a in self.adapters if a not in self.hot])
            admin.update_adapter(aid, hot=True)
            self.hot.append(aid)
        elif kind == "prewarm":
            admin.prewarm(aid, replicas=self.rng.choice([1, 2]))
        return kind, "ok"


# --------------------------------------------------------------------------- the run


async def watch_replicas(sim_urls: list[str], most: dict[str, int], stop: asyncio.Event) -> None:
    """The most LoRA adapters each replica's own ``/v1/models`` listed (SPEC §17: ≤ max_adapters)."""
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as s:
        while not stop.is_set():
            for u in sim_urls:
                try:
                    async with s.get(f"{u}/v1/models") as r:
                        data = await r.json()
                    n = sum(1 for m in data.get("data", []) if m.get("parent"))
                    most[u] = max(most.get(u, 0), n)
                except (aiohttp.ClientError, TimeoutError, ValueError):
                    continue
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 0.5)


async def drive(
    args: argparse.Namespace, p: Platform, traffic: Traffic, sampler: Sampler, churn: Churn
) -> dict[str, Any]:
    stop, thread_stop = asyncio.Event(), threading.Event()
    rng = random.Random(args.seed)
    workers = []
    for i in range(args.concurrency):
        tenant = "alpha" if i % 4 < 3 else "beta"
        workers.append(
            traffic.worker(random.Random(rng.random()), i % len(p.gateway_urls), tenant, stop, None)
        )
    for i in range(TIGHT_WORKERS):  # one more than its max_concurrency: some 429s for concurrency too
        workers.append(
            traffic.worker(
                random.Random(rng.random()),
                i % len(p.gateway_urls),
                "tight",
                stop,
                args.tight_rps / TIGHT_WORKERS,
            )
        )
    most: dict[str, int] = {}
    tasks = [asyncio.create_task(w) for w in workers]
    tasks.append(asyncio.create_task(watch_replicas(p.sim_urls, most, stop)))
    threads = [
        threading.Thread(target=churn.loop, args=(args.churn_every_s, thread_stop), name="churn"),
        threading.Thread(target=sampler.loop, args=(args.sample_every_s, thread_stop), name="sampler"),
    ]
    for t in threads:
        t.start()
    named: dict[str, dict[str, Any]] = {}
    try:
        log(f"warm-up {args.warmup_s:.0f} s …")
        await asyncio.sleep(args.warmup_s)
        traffic.phase = "soak"
        t_start = time.monotonic()
        named["start"] = await asyncio.to_thread(sampler.take, "start")
        log(f"start: {summary_line(named['start'])}")
        await asyncio.sleep(args.duration_s / 2)
        t_middle = time.monotonic()
        named["middle"] = await asyncio.to_thread(sampler.take, "middle")
        log(f"middle: {summary_line(named['middle'])}; {len(traffic.outcomes)} requests so far")
        await asyncio.sleep(args.duration_s / 2)
        named["end"] = await asyncio.to_thread(sampler.take, "end")
        t_end = time.monotonic()
        log(f"end: {summary_line(named['end'])}; {len(traffic.outcomes)} requests")
    finally:
        thread_stop.set()
        stop.set()
        await asyncio.gather(*tasks, return_exceptions=True)
        for t in threads:
            t.join(timeout=120)
    return {
        "named": named,
        "t_start": t_start,
        "t_middle": t_middle,
        "t_end": t_end,
        "replica_max_adapters": most,
    }


def summary_line(s: dict[str, Any]) -> str:
    return (
        ", ".join(f"{k} {v['rss_mb']} MB/{v['fds']} fd" for k, v in s["procs"].items())
        + f"; load {s['load_avg']}"
    )


def metric_sums(url: str) -> dict[str, dict[str, float]]:
    """Totals of the router's load/unload/placement counters and the gateway's requests by code."""
    want = {
        "loraplane_adapter_loads": "result",
        "loraplane_adapter_unloads": "reason",
        "loraplane_placement": "outcome",
        "loraplane_gateway_requests": "code",
        "loraplane_gateway_errors": "error",
    }
    out: dict[str, dict[str, float]] = {k: {} for k in want}
    text = httpx.get(f"{url}/metrics", timeout=30).text
    for fam in text_string_to_metric_families(text):
        if fam.name in want:
            for smp in fam.samples:
                if smp.name.endswith("_total"):
                    k = smp.labels.get(want[fam.name], "")
                    out[fam.name][k] = out[fam.name].get(k, 0) + smp.value
    return out


def scan_log(path: Path) -> dict[str, Any]:
    """Lines by level (JSON logs of the loraplane processes; plain text of the simulators), the
    first error lines and the most frequent warnings."""
    if not path.exists():
        return {"path": str(path), "missing": True}
    levels: Counter[str] = Counter()
    errors: list[str] = []
    warns: Counter[str] = Counter()
    for ln in path.read_text(errors="replace").splitlines():
        try:
            rec = orjson.loads(ln)
            level, msg = str(rec.get("level", "?")), str(rec.get("msg", ""))
        except (orjson.JSONDecodeError, AttributeError):
            m = re.search(r"\b(DEBUG|INFO|WARNING|ERROR|CRITICAL)\b", ln)
            level, msg = (m.group(1).lower() if m else "text"), ln
            if "Traceback" in ln:
                level = "error"
        levels[level] += 1
        if level in ("error", "critical") and len(errors) < 8:
            errors.append(ln[:600])
        elif level == "warning":
            warns[re.sub(r"\d+", "N", msg)[:160]] += 1
    return {
        "path": str(path),
        "lines_by_level": dict(levels),
        "error_lines": levels["error"] + levels["critical"],
        "first_errors": errors,
        "top_warnings": warns.most_common(6),
    }


def lines_with(paths: list[Path], needle: str, most: int = 6) -> list[str]:
    out: list[str] = []
    for path in paths:
        if path.exists():
            out += [
                f"{path.name}: {ln[:700]}"
                for ln in path.read_text(errors="replace").splitlines()
                if needle in ln
            ]
    return out[:most]


def growth(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    d_rss = round(b["rss_mb"] - a["rss_mb"], 1)
    d_pct = round(100 * d_rss / a["rss_mb"], 1) if a["rss_mb"] else None
    d_fd = b["fds"] - a["fds"]
    flat = d_rss <= max(RSS_FLAT_MB, RSS_FLAT_PCT / 100 * a["rss_mb"]) and d_fd <= FD_FLAT
    return {
        "rss_mb": d_rss,
        "rss_pct": d_pct,
        "fds": d_fd,
        "threads": b["threads"] - a["threads"],
        "flat": flat,
    }


def server_ports(p: Platform, s3: ls.S3Server, redis_url: str) -> dict[int, str]:
    def port(url: str, default: int) -> int:
        return urlsplit(url).port or default

    ports = {port(redis_url, 6379): "redis", port(ls.pg_server_url(), 5432): "postgres"}
    ports |= {port(s3.endpoint_url, 80): "s3", port(p.admin_url, 80): "registry"}
    ports |= {port(u, 80): "gateway" for u in p.gateway_urls} | {port(u, 80): "replica" for u in p.sim_urls}
    return ports


def setup(p: Platform, n_adapters: int) -> tuple[list[str], dict[str, str], dict[str, list[str]]]:
    ids = [f"soak-{i:02d}" for i in range(n_adapters)]
    for aid in ids:
        p.adapter(aid, versions=1, promote="v1")
    grants = {"alpha": ids, "beta": ids[::2], "tight": ids[:4]}
    limits = {
        "alpha": None,
        "beta": None,
        "tight": {"rpm": 120, "tpm": None, "max_concurrency": 2},
    }
    keys = {}
    for t, lim in limits.items():
        p.admin.create_tenant(t, limits=lim)
        for aid in grants[t]:
            p.admin.put_grant(t, aid)
        keys[t] = str(p.admin.issue_key(t)["key"])
    return ids, keys, grants


def report(out: dict[str, Any]) -> None:
    r = out["requests"]
    t = Table(
        title=f"requests in the soak ({r['total']} in {out['settings']['duration_s']} s, {r['per_s']}/s)"
    )
    for c in ("status", "code", "count", "kind"):
        t.add_column(c)
    for row in r["by_status_code"]:
        t.add_row(str(row["status"]), row["code"], str(row["count"]), row["kind"])
    console.print(t)
    console.print(
        f"unexpected: {r['unexpected']} (warm-up: {out['warmup_requests']['unexpected']} of "
        f"{out['warmup_requests']['total']}); latency ok p50/p99 stream {r['ok_stream_p50_ms']}/"
        f"{r['ok_stream_p99_ms']} ms, non-stream {r['ok_plain_p50_ms']}/{r['ok_plain_p99_ms']} ms"
    )
    for u in r["unexpected_samples"][:10]:
        console.print(f"  [red]{u}[/red]")
    t = Table(title=f"churn (admin API) during the soak: {out['churn']['total']} operations")
    for c in ("kind", "done", "results", "p50 ms", "max ms"):
        t.add_column(c)
    for k, v in out["churn"]["by_kind"].items():
        t.add_row(k, str(v["count"]), json.dumps(v["results"]), str(v["p50_ms"]), str(v["max_ms"]))
    console.print(t)
    console.print(f"router (both gateways, whole run): {json.dumps(out['router'])}")
    console.print(
        f"most adapters registered per replica (max_adapters {MAX_ADAPTERS}): {out['replica_max_adapters']}"
    )
    t = Table(title=f"processes: RSS MB / open FDs (flat: {FLAT_RULE})")
    for c in ("process", "start", "middle", "end", "Δ start→end", "Δ middle→end", "MB/min", "flat"):
        t.add_column(c)
    for name, g in out["processes"].items():
        cells = [f"{g[x]['rss_mb']} / {g[x]['fds']}" for x in ("start", "middle", "end")]
        se, me = g["growth_start_end"], g["growth_middle_end"]
        t.add_row(
            name,
            *cells,
            f"{se['rss_mb']:+} MB ({se['rss_pct']:+} %) / {se['fds']:+}",
            f"{me['rss_mb']:+} MB / {me['fds']:+}",
            str(g["rss_slope_mb_per_min"]),
            "yes" if se["flat"] else "[red]NO[/red]",
        )
    console.print(t)
    n = out["named_extra"]
    console.print(f"staging MB start/middle/end: {n['staging_mb']}; gateway /metrics KB: {n['metrics_kb']}")
    for name, g in out["processes"].items():
        per_req = g.get("cpu_ms_per_request_halves")
        console.print(
            f"{name}: CPU s first/second half {g['cpu_s_halves']}"
            + (f", CPU ms per request {per_req} ({g['requests_halves']} requests)" if per_req else "")
            + f"; FDs start {g['start']['fd_kinds']}, change {g['fd_kinds_change']}"
        )
    console.print(f"load average samples (1-min): {out['machine']['load_avg_1m']}")
    for name, lg in out["logs"].items():
        if lg.get("error_lines"):
            console.print(
                f"[yellow]{name}: {lg['error_lines']} error lines[/yellow] e.g. {lg['first_errors'][:2]}"
            )


def slope(points: list[tuple[float, float]]) -> float | None:
    """Least-squares slope of (seconds, MB) in MB per minute."""
    if len(points) < 3:
        return None
    n = len(points)
    mx, my = sum(x for x, _ in points) / n, sum(y for _, y in points) / n
    den = sum((x - mx) ** 2 for x, _ in points)
    return round(60 * sum((x - mx) * (y - my) for x, y in points) / den, 3) if den else None


def per_minute(outcomes: list[Outcome]) -> list[dict[str, Any]]:
    if not outcomes:
        return []
    t0 = min(o.t for o in outcomes)
    rows: dict[int, list[Outcome]] = {}
    for o in outcomes:
        rows.setdefault(int((o.t - t0) // 60), []).append(o)
    return [
        {
            "minute": k,
            "requests": len(v),
            "ok": sum(o.code == "ok" for o in v),
            "unexpected": sum(o.unexpected for o in v),
            "ok_p50_ms": round(1000 * (pct([o.seconds for o in v if o.code == "ok"], 50) or 0), 1),
        }
        for k, v in sorted(rows.items())
    ]


def summarize(outcomes: list[Outcome], seconds: float) -> dict[str, Any]:
    by: Counter[tuple[int, str]] = Counter((o.status, o.code) for o in outcomes)
    rows = []
    for (status, code), n in sorted(by.items(), key=lambda kv: (-kv[1], kv[0])):
        kind = (
            "ok"
            if code == "ok"
            else (
                "designed"
                if ((status, code) in DESIGNED or code.startswith("stream_error:"))
                else "UNEXPECTED"
            )
        )
        rows.append({"status": status, "code": code, "count": n, "kind": kind})
    unexpected = [o for o in outcomes if o.unexpected]
    ok_stream = [o.seconds for o in outcomes if o.code == "ok" and o.stream]
    ok_plain = [o.seconds for o in outcomes if o.code == "ok" and not o.stream]

    def ms(x: float | None) -> float | None:
        return None if x is None else round(x * 1000, 1)

    return {
        "total": len(outcomes),
        "per_s": round(len(outcomes) / seconds, 1) if seconds else None,
        "ok": sum(1 for o in outcomes if o.code == "ok"),
        "unexpected": len(unexpected),
        "by_status_code": rows,
        "by_status": dict(Counter(str(o.status) for o in outcomes)),
        "by_tenant": {
            t: dict(Counter(o.code for o in outcomes if o.tenant == t))
            for t in sorted({o.tenant for o in outcomes})
        },
        "by_gateway": {
            f"gateway-{g + 1}": sum(1 for o in outcomes if o.gateway == g)
            for g in sorted({o.gateway for o in outcomes})
        },
        "streamed": sum(1 for o in outcomes if o.stream),
        "ok_stream_p50_ms": ms(pct(ok_stream, 50)),
        "ok_stream_p99_ms": ms(pct(ok_stream, 99)),
        "ok_plain_p50_ms": ms(pct(ok_plain, 50)),
        "ok_plain_p99_ms": ms(pct(ok_plain, 99)),
        "max_ms": ms(max((o.seconds for o in outcomes), default=None)),
        "per_minute": per_minute(outcomes),
        "unexpected_samples": [
            f"+{o.t:.1f}s gw{o.gateway + 1} {o.tenant} stream={o.stream} {o.status} {o.code} "
            f"rid={o.rid} {o.detail}"
            for o in unexpected[:40]
        ],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--duration-s", type=float, default=600)
    ap.add_argument("--warmup-s", type=float, default=45)
    ap.add_argument("--adapters", type=int, default=32)
    ap.add_argument("--concurrency", type=int, default=8, help="closed-loop connections (tenants alpha/beta)")
    ap.add_argument(
        "--tight-rps", type=float, default=3.0, help="requests/s of the rate-limited tenant (rpm 120)"
    )
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--stream-fraction", type=float, default=0.5)
    ap.add_argument("--churn-every-s", type=float, default=3.0)
    ap.add_argument("--sample-every-s", type=float, default=15.0)
    ap.add_argument("--request-timeout-s", type=float, default=120.0)
    ap.add_argument("--sim-args", default="", help="simulator flags (default: realistic timings)")
    ap.add_argument("--log-level", default="INFO", help="of the registry and gateways (INFO: access logs)")
    ap.add_argument("--seed", type=int, default=13)
    ap.add_argument("--keep", action="store_true", help="keep the platform's work directory (logs)")
    ap.add_argument("--label", default="")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "soak.json"))
    args = ap.parse_args()

    load_before = os.getloadavg()
    s3 = ls.start_s3_server()
    redis_url = ls.redis_server_url()
    workdir: Path | None = None
    try:
        with run_platform(
            s3, redis_url, gateways=2, sims=3, sim_args=args.sim_args.split(),
            env={"LORAPLANE_LOG_LEVEL": args.log_level},
            pool={"max_loras": MAX_LORAS, "max_adapters": MAX_ADAPTERS},
        ) as p:  # fmt: skip
            workdir = p.workdir
            log(f"platform up ({p.workdir}); {args.adapters} adapters, tenants …")
            ids, keys, grants = setup(p, args.adapters)
            names = {"registry": p.procs[0].pid} | {
                f"gateway-{i}": pr.pid for i, pr in enumerate(p.procs[1:], 1)
            }
            names |= {f"simulator-{i}": sim.pid for i, sim in enumerate(p.sims, 1)}
            assert s3.process is not None and s3.process.pid is not None
            names["s3 (weed)"] = s3.process.pid
            procs = {k: v for k, v in names.items() if v is not None}
            sim_logs = {f"simulator-{i}": sim.log_path for i, sim in enumerate(p.sims, 1)}
            sampler = Sampler(procs, server_ports(p, s3, redis_url), p.internal_urls, p.workdir / "staging")
            traffic = Traffic(
                p.gateway_urls, keys, grants, args.max_tokens, args.stream_fraction, args.request_timeout_s
            )
            churn = Churn(p.admin_url, ids, p.workdir, random.Random(args.seed + 1))
            sampler.take("before warm-up")
            t_run = time.monotonic()
            run = uvloop.run(drive(args, p, traffic, sampler, churn))
            metrics = {f"gateway-{i}": metric_sums(u) for i, u in enumerate(p.internal_urls, 1)}
            since = time.strftime(
                "%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() - (time.monotonic() - t_run) - 5)
            )
            audit = Counter(e["action"] for e in p.admin.list_audit(since=since))
            load_failed = Counter(
                str((e.get("details") or {}).get("reason"))[:80]
                for e in p.admin.list_audit(action="adapter.load_failed", since=since)
            )
            log_paths = [pr.log_path for pr in p.procs]
            logs = {pr.name: scan_log(pr.log_path) for pr in p.procs} | {
                k: scan_log(v) for k, v in sim_logs.items()
            }
            if s3.workdir is not None:
                logs["s3 (weed)"] = {
                    "lines": len((s3.workdir / "weed.log").read_text(errors="replace").splitlines())
                }
    finally:
        s3.stop()
    soak = [o for o in traffic.outcomes if o.phase == "soak" and run["t_start"] <= o.t <= run["t_end"]]
    warm = [o for o in traffic.outcomes if o.phase == "warmup"]
    halves = {
        f"gateway-{g + 1}": (
            sum(1 for o in soak if o.gateway == g and o.t < run["t_middle"]),
            sum(1 for o in soak if o.gateway == g and o.t >= run["t_middle"]),
        )
        for g in range(len(traffic.gateway_urls))
    }
    base = min((o.t for o in traffic.outcomes), default=0.0)
    for o in traffic.outcomes:
        o.t -= base
    named = run["named"]
    processes = {}
    a_t, e_t = named["start"]["t_s"], named["end"]["t_s"]
    for name in procs:
        a, m, e = (named[x]["procs"][name] for x in ("start", "middle", "end"))
        processes[name] = {
            "start": a,
            "middle": m,
            "end": e,
            "growth_start_end": growth(a, e),
            "growth_middle_end": growth(m, e),
            "rss_slope_mb_per_min": slope(
                [(x["t_s"], x["procs"][name]["rss_mb"]) for x in sampler.samples if a_t <= x["t_s"] <= e_t]
            ),
            "fd_kinds_change": {
                k: e["fd_kinds"].get(k, 0) - a["fd_kinds"].get(k, 0)
                for k in sorted(set(a["fd_kinds"]) | set(e["fd_kinds"]))
                if e["fd_kinds"].get(k, 0) != a["fd_kinds"].get(k, 0)
            },
            "cpu_s_halves": [round(m["cpu_s"] - a["cpu_s"], 1), round(e["cpu_s"] - m["cpu_s"], 1)],
        }
        if name in halves:
            processes[name]["requests_halves"] = list(halves[name])
            processes[name]["cpu_ms_per_request_halves"] = [
                round(1000 * c / n, 2) if n else None
                for c, n in zip(processes[name]["cpu_s_halves"], halves[name], strict=True)
            ]
    churn_by_kind = {}
    in_soak = [op for op in churn.ops if run["t_start"] <= op[0] <= run["t_end"]]
    for k in sorted({op[1] for op in in_soak}):
        c = Counter(op[2] for op in in_soak if op[1] == k)
        secs = [op[3] for op in in_soak if op[1] == k]
        churn_by_kind[k] = {
            "count": sum(c.values()),
            "results": dict(c),
            "p50_ms": round((pct(secs, 50) or 0) * 1000, 1),
            "max_ms": round(max(secs, default=0) * 1000, 1),
        }
    router: dict[str, dict[str, float]] = {}
    for m in metrics.values():
        for fam, vals in m.items():
            if fam.startswith("loraplane_adapter") or fam == "loraplane_placement":
                for k, v in vals.items():
                    router.setdefault(fam, {})[k] = router.setdefault(fam, {}).get(k, 0) + v
    out = {
        "benchmark": "soak",
        "label": args.label,
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "load_avg_before": [round(x, 2) for x in load_before],
            "load_avg_1m": [s["load_avg"][0] for s in sampler.samples],
            "note": "shared machine: other helpers' tests and benchmarks ran at the same time",
        },
        "settings": {
            "duration_s": args.duration_s,
            "warmup_s": args.warmup_s,
            "gateways": 2,
            "simulators": 3,
            "sim_args": args.sim_args,
            "log_level": args.log_level,
            "max_loras": MAX_LORAS,
            "max_adapters": MAX_ADAPTERS,
            "adapters": args.adapters,
            "concurrency": args.concurrency,
            "tight_rps": args.tight_rps,
            "max_tokens": args.max_tokens,
            "stream_fraction": args.stream_fraction,
            "churn_every_s": args.churn_every_s,
            "flat_rule": FLAT_RULE,
        },
        "requests": summarize(soak, run["t_end"] - run["t_start"]),
        "warmup_requests": {
            "total": len(warm),
            "unexpected": sum(o.unexpected for o in warm),
            "by_code": dict(Counter(f"{o.status} {o.code}" for o in warm)),
        },
        "churn": {
            "by_kind": churn_by_kind,
            "total": len(in_soak),
            "during_warmup": dict(Counter(op[1] for op in churn.ops if op[0] < run["t_start"])),
            "failures": churn.failures[:40],
        },
        "router": router,
        "gateway_metrics": metrics,
        "audit_actions": dict(audit),
        "load_failed_reasons": dict(load_failed),
        "replica_max_adapters": run["replica_max_adapters"],
        "processes": processes,
        "named_extra": {
            "staging_mb": [named[x]["staging_mb"] for x in ("start", "middle", "end")],
            "metrics_kb": {
                g: [named[x]["metrics_kb"].get(g) for x in ("start", "middle", "end")]
                for g in named["start"]["metrics_kb"]
            },
        },
        "samples": sampler.samples,
        "logs": logs,
        "unexpected_log_lines": {
            o.rid: lines_with(log_paths, o.rid)
            for o in [o for o in warm + soak if o.unexpected and o.rid][:20]
        },
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=2) + "\n")
    report(out)
    if workdir is not None and not args.keep and not out["requests"]["unexpected"]:
        shutil.rmtree(workdir, ignore_errors=True)
    elif workdir is not None:
        console.print(f"logs kept in {workdir}")
    console.print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
