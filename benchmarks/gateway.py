"""Gateway overhead benchmark: the same load straight to a replica, through ONE loraplane gateway
process, and through ONE LiteLLM proxy worker.

Set-up: one simulator replica in zero-latency mode; the registry (`loraplane serve --role
registry`, SQLite) and the gateway (`loraplane serve --role gateway`: auth, model resolution,
rate limits — Redis by default, ``--limiter memory`` for the in-memory one — routing, usage
settlement, metrics, one JSON log line per request) as separate processes; a tenant with
generous rpm/tpm; ``--adapters`` adapters made resident before measuring. LiteLLM
(``litellm[proxy]==1.108.*`` in its own virtualenv: ``--litellm`` or ``$LORAPLANE_LITELLM``, else
``<repo>/.venv-litellm``, else installed by this script into ``$LORAPLANE_BENCH_DIR``; one worker,
``LITELLM_LOCAL_MODEL_COST_MAP=True``) routes the same model names to the same replica
(``openai/<lora_name>``), with a virtual key whose rpm, tpm and parallel-request limits come
from its ``custom_auth`` hook, kept in the same Redis as loraplane's (``coordination_redis``) or,
with ``--limiter memory`` / ``--litellm-limiter memory``, in its worker's memory.

Load: an aiohttp client, closed loop, ``--concurrency`` connections for ``--duration`` seconds,
chat completions round-robin over the adapters, non-streaming and streaming. Reported per
target: req/s, p50/p99 latency, the p50/p99 added over direct, and time to first streamed
byte (and its p50 added over direct), and the CPU the answering process spent per request
(utime + stime from ``/proc/<pid>/stat`` before and after each row, over every request that
row completed, warm-up included: the replica for "direct", the gateway process, the LiteLLM
worker with its child processes), which stays comparable when other jobs load the machine.
The load average (1 min) is recorded before and after each row. ``--profile DIR`` samples the
gateway with py-spy during its rows (one collapsed-stack file per row). Writes
``benchmarks/results/gateway.json``.

    .venv/bin/python benchmarks/gateway.py [--concurrency 1,32,128] [--duration 5] [--skip-litellm]
        [--litellm PATH] [--limiter redis|memory] [--litellm-limiter same|redis|memory]
        [--modes plain,stream] [--rounds N] [--profile DIR]

``--rounds N`` runs every (mode, concurrency) N times with all targets in turn each time; the
summary gives each round's LiteLLM-over-gateway ratios and their median.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import secrets
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from kit import localservices as ls  # noqa: E402
from kit.procs import ManagedProcess, http_ready  # noqa: E402
from kit.procs import stop_all as stop_procs  # noqa: E402
from registry.adapter_factory import write_adapter  # noqa: E402
from registry.admin_client import AdminClient  # noqa: E402
from registry.demo import demo_base_model  # noqa: E402

TOKEN = "bench-admin-token-0123456789"
LITELLM_SPEC = "litellm[proxy]==1.108.*"
BENCH_DIR = Path(os.environ.get("LORAPLANE_BENCH_DIR", Path.home() / ".cache" / "loraplane" / "bench"))
MSG = [{"role": "user", "content": "Write one short sentence about the sea."}]

CUSTOM_AUTH = """
from fastapi import Request
from litellm.proxy._types import UserAPIKeyAuth

KEYS = {"sk-bench-tenant": "bench"}

async def user_api_key_auth(request: Request, api_key: str) -> UserAPIKeyAuth:
    key = api_key.removeprefix("Bearer ").strip()
    if key not in KEYS:
        raise Exception("invalid key")
    # the tenant's limits as on the loraplane side: rpm, tpm and a concurrency cap
    return UserAPIKeyAuth(
        api_key=key,
        user_id=KEYS[key],
        rpm_limit=10_000_000,
        tpm_limit=10_000_000_000,
        max_parallel_requests=100_000,
    )
"""


def cpu_seconds(pid: int) -> float:
    """utime + stime of ``pid`` and its descendants still alive (Linux /proc), in seconds."""
    total = 0
    todo = [pid]
    while todo:
        p = todo.pop()
        try:
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])
        for task in Path(f"/proc/{p}/task").glob("*/children"):
            with contextlib.suppress(OSError):
                todo += [int(c) for c in task.read_text().split()]
    return total / os.sysconf("SC_CLK_TCK")


def redis_commands(url: str | None) -> int:
    """Commands the Redis server at ``url`` has run so far (``INFO stats``; 0 without one)."""
    if url is None:
        return 0
    import redis

    with redis.Redis.from_url(url) as r:
        return int(r.info("stats")["total_commands_processed"])


def load_avg() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def find_litellm(given: str | None) -> Path | None:
    """The ``litellm`` executable: ``--litellm`` / ``LORAPLANE_LITELLM`` (the executable or its
    virtualenv), else ``<repo>/.venv-litellm`` when it exists; None → install (``ensure_litellm``)."""
    for cand in (given, os.environ.get("LORAPLANE_LITELLM")):
        if cand:
            p = Path(cand).expanduser()
            exe = p / "bin" / "litellm" if p.is_dir() else p
            if not exe.exists():
                raise SystemExit(f"no LiteLLM executable at {exe}")
            return exe
    local = ROOT / ".venv-litellm" / "bin" / "litellm"
    return local if local.exists() else None


def ensure_litellm() -> Path | None:
    venv = BENCH_DIR / "litellm-venv"
    exe = venv / "bin" / "litellm"
    marker = venv / ".loraplane-spec"
    if exe.exists() and marker.exists() and marker.read_text() == LITELLM_SPEC:
        return exe
    log(f"installing {LITELLM_SPEC} into {venv} (once; about a minute) …")
    venv.parent.mkdir(parents=True, exist_ok=True)
    try:
        if not (venv / "bin" / "pip").exists():
            subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run([str(venv / "bin" / "pip"), "install", "-q", LITELLM_SPEC], check=True, timeout=900)
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as e:
        log(f"LiteLLM could not be installed: {e}")
        return None
    marker.write_text(LITELLM_SPEC)
    return exe


def litellm_version(exe: Path) -> str:
    try:
        out = subprocess.run(
            [str(exe.parent / "python"), "-c", "import importlib.metadata as m; print(m.version('litellm'))"],
            capture_output=True, text=True, timeout=60, check=True,
        )  # fmt: skip
        return f"litellm[proxy]=={out.stdout.strip()}"
    except (subprocess.SubprocessError, OSError):
        return LITELLM_SPEC


# ---------------------------------------------------------------------------------- load


async def run_load(
    url: str,
    key: str,
    models: list[str],
    *,
    concurrency: int,
    duration: float,
    stream: bool,
    warmup: float = 1.0,
) -> dict[str, Any]:
    lat: list[float] = []
    ttfb: list[float] = []
    errors = 0
    headers = {"authorization": f"Bearer {key}", "content-type": "application/json"}
    bodies = [
        json.dumps({"model": m, "messages": MSG, "max_tokens": 16, "stream": stream}).encode() for m in models
    ]
    conn = aiohttp.TCPConnector(limit=concurrency, force_close=False)
    timeout = aiohttp.ClientTimeout(total=60)
    t_start = time.perf_counter()
    t_measure = t_start + warmup
    t_end = t_measure + duration
    counter = 0
    completed = 0  # every answer, warm-up included (for the CPU per request)

    async def worker(session: aiohttp.ClientSession, wid: int) -> None:
        nonlocal errors, counter, completed
        i = wid
        while True:
            now = time.perf_counter()
            if now >= t_end:
                return
            body = bodies[i % len(bodies)]
            i += 1
            t0 = time.perf_counter()
            try:
                async with session.post(url, data=body, headers=headers) as r:
                    first = None
                    if stream:
                        async for _chunk in r.content.iter_any():
                            if first is None:
                                first = time.perf_counter()
                    else:
                        await r.read()
                    ok = r.status == 200
            except (aiohttp.ClientError, TimeoutError):
                ok = False
            t1 = time.perf_counter()
            completed += 1
            if t0 >= t_measure and t1 <= t_end:
                if ok:
                    lat.append(t1 - t0)
                    if first is not None:
                        ttfb.append(first - t0)
                    counter += 1
                else:
                    errors += 1

    async with aiohttp.ClientSession(connector=conn, timeout=timeout) as session:
        await asyncio.gather(*[worker(session, w) for w in range(concurrency)])
    lat.sort()
    ttfb.sort()

    def pct(xs: list[float], p: float) -> float | None:
        return round(xs[min(len(xs) - 1, int(p * len(xs)))] * 1000, 3) if xs else None

    return {
        "requests": counter,
        "completed": completed,
        "errors": errors,
        "rps": round(counter / duration, 1),
        "p50_ms": pct(lat, 0.50),
        "p99_ms": pct(lat, 0.99),
        "ttfb_p50_ms": pct(ttfb, 0.50) if stream else None,
        "ttfb_p99_ms": pct(ttfb, 0.99) if stream else None,
    }


# ---------------------------------------------------------------------------------- set-up


def setup_platform(
    work: Path, sim_url: str, adapters: int, limiter: str
) -> tuple[list[ManagedProcess], str, str, list[str]]:
    from registry import migrate

    db = f"sqlite:///{work / 'bench.db'}"
    migrate.upgrade(db)
    admin_port, gw_port = ls.free_port(), ls.free_port()
    env = {
        **os.environ,
        "LORAPLANE_DATABASE_URL": db,
        "LORAPLANE_ADMIN_TOKEN": TOKEN,
        "LORAPLANE_DATA_DIR": str(work / "data"),
        "LORAPLANE_ADMIN_PORT": str(admin_port),
        "LORAPLANE_GATEWAY_PORT": str(gw_port),
        "LORAPLANE_POOLS": json.dumps(
            [
                {
                    "name": "bench",
                    "base_model": "demo-base",
                    "urls": [sim_url],
                    "max_loras": 8,
                    "max_adapters": 16,
                }
            ]
        ),
        "LORAPLANE_LOG_LEVEL": os.environ.get("BENCH_GATEWAY_LOG_LEVEL", "INFO"),
    }
    env.pop("LORAPLANE_REDIS_URL", None)
    if limiter == "redis":
        env["LORAPLANE_REDIS_URL"] = ls.redis_server_url()
        env["LORAPLANE_REDIS_PREFIX"] = ls.unique_redis_prefix("bench")
    cli = [sys.executable, "-m", "loraplane.cli", "serve", "--role"]
    reg = ManagedProcess([*cli, "registry"], env=env, log_path=work / "registry.log").start()
    # the gateway's log lines go to a file (one JSON line per request, as in production)
    gw = ManagedProcess([*cli, "gateway"], env=env, log_path=work / "gateway.log").start()
    admin_url, gw_url = f"http://127.0.0.1:{admin_port}", f"http://127.0.0.1:{gw_port}"
    reg.wait_ready(http_ready(f"{admin_url}/admin/v1/healthz"), 120)
    with AdminClient(admin_url, TOKEN) as a:
        spec = demo_base_model()
        a.create_base_model(
            spec["name"], spec["hf_id"], spec["max_lora_rank"], spec["target_modules"], spec["module_shapes"]
        )
        names = []
        for i in range(adapters):
            aid = f"bench-{i}"
            a.create_adapter(aid, "demo-base")
            d = work / "src" / aid
            write_adapter(d, seed=100 + i, rank=8, target_modules=("q_proj", "v_proj"))
            v = a.upload_version(aid, d)
            a.promote(aid, v["version"])
            names.append(f"demo-base:{aid}")
        a.create_tenant(
            "bench", limits={"rpm": 100_000_000, "tpm": 2_000_000_000, "max_concurrency": 100_000}
        )
        for i in range(adapters):
            a.put_grant("bench", f"bench-{i}")
        key = a.issue_key("bench")["key"]
    gw.wait_ready(http_ready(f"{gw_url}/readyz"), 120)
    # make every adapter resident (and the gateway's routing table current)
    for m in names:
        for _ in range(100):
            r = httpx.post(
                f"{gw_url}/v1/chat/completions",
                headers={"authorization": f"Bearer {key}"},
                json={"model": m, "messages": MSG, "max_tokens": 2},
                timeout=60,
            )
            if r.status_code == 200:
                break
            time.sleep(0.1)
        else:
            raise RuntimeError(f"warm-up of {m} failed: {r.status_code} {r.text}")
    return [gw, reg], gw_url, key, names


def lora_names(sim_url: str) -> dict[str, str]:
    """client model string → lora_name resident on the replica."""
    out = {}
    for card in httpx.get(f"{sim_url}/v1/models").json()["data"]:
        mid = card["id"]
        if "@" in mid:
            out["demo-base:" + mid.split("@", 1)[0]] = mid
    return out


def start_litellm(
    exe: Path, work: Path, sim_url: str, mapping: dict[str, str], redis_url: str | None
) -> tuple[ManagedProcess, str]:
    """One LiteLLM worker; with ``redis_url`` its rate limits (rpm, tpm, parallel requests) are
    kept in that Redis (``general_settings.coordination_redis``: LiteLLM's cross-pod limits, as
    several workers or pods would need), else in the worker's memory."""
    cfg_dir = work / "litellm"
    cfg_dir.mkdir()
    (cfg_dir / "custom_auth.py").write_text(CUSTOM_AUTH)
    lines = ["model_list:"]
    for client_model, lora in mapping.items():
        lines += [
            f'  - model_name: "{client_model}"',
            "    litellm_params:",
            f'      model: "openai/{lora}"',
            f'      api_base: "{sim_url}/v1"',
            '      api_key: "none"',
        ]
    lines += [
        "general_settings:",
        "  custom_auth: custom_auth.user_api_key_auth",
        # 1.108 refuses to boot without a master key, even with custom_auth doing the checks
        f'  master_key: "sk-{secrets.token_hex(32)}"',
        *(["  coordination_redis:", f'    url: "{redis_url}"'] if redis_url else []),
        "litellm_settings:",
        "  drop_params: true",
        "  telemetry: false",
    ]
    (cfg_dir / "config.yaml").write_text("\n".join(lines) + "\n")
    port = ls.free_port()
    env = {
        **os.environ,
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",
        "LITELLM_TELEMETRY": "False",
        "PYTHONPATH": str(cfg_dir),
    }
    proc = ManagedProcess(
        [
            str(exe),
            "--config",
            str(cfg_dir / "config.yaml"),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--num_workers",
            "1",
        ],
        env=env | {"PWD": str(cfg_dir)},
        log_path=work / "litellm.log",
    ).start()
    url = f"http://127.0.0.1:{port}"
    proc.wait_ready(http_ready(f"{url}/health/liveliness"), 180)
    return proc, url


# ---------------------------------------------------------------------------------- main


def fmt(v: Any) -> str:
    return "-" if v is None else (f"{v:.2f}" if isinstance(v, float) else str(v))


def start_profile(pid: int, out: Path) -> subprocess.Popen[bytes] | None:
    """py-spy sampling ``pid`` (collapsed stacks, one line per stack with its sample count)."""
    exe = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    if not Path(exe).exists():
        log("py-spy not found: pip install py-spy")
        return None
    return subprocess.Popen(
        [exe, "record", "--pid", str(pid), "--rate", "250", "--format", "raw", "-o", str(out)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


async def measure(
    targets: dict[str, tuple[str, str, list[str], int]],
    concs: list[int],
    duration: float,
    profile: Path | None = None,
    modes: tuple[bool, ...] = (False, True),
    redis_url: str | None = None,
    rounds: int = 1,
) -> list[dict[str, Any]]:
    """Each row also counts the commands the Redis server ran during it, per request (with
    ``redis_url``): what each target asks of Redis per request (its background work included).
    With ``rounds`` > 1 every (mode, concurrency) runs all targets in turn that many times, so
    each round's ratios compare rows taken side by side."""
    rows = []
    for stream in modes:
        for c in concs:
            for rnd in range(rounds):
                base: dict[str, Any] | None = None
                for name, (url, key, models, pid) in targets.items():
                    spy = None
                    if profile is not None and name == "gateway":
                        suffix = f"-r{rnd + 1}" if rounds > 1 else ""
                        spy = start_profile(
                            pid, profile / f"gateway-{'stream' if stream else 'plain'}-c{c}{suffix}.txt"
                        )
                        await asyncio.sleep(1.0)  # py-spy attached before the load starts
                    la0 = load_avg()
                    cmds0 = redis_commands(redis_url)
                    cpu0 = cpu_seconds(pid)
                    res = await run_load(url, key, models, concurrency=c, duration=duration, stream=stream)
                    cpu = cpu_seconds(pid) - cpu0
                    cmds = redis_commands(redis_url) - cmds0
                    if spy is not None:
                        spy.send_signal(2)  # SIGINT: py-spy writes its file and exits
                        spy.wait(30)
                    res["cpu_ms_per_req"] = (
                        round(cpu * 1000 / res["completed"], 3) if res["completed"] else None
                    )
                    res["load_avg_1m"] = [la0[0], load_avg()[0]]
                    if redis_url is not None and res["completed"]:
                        res["redis_cmds_per_req"] = round(cmds / res["completed"], 2)
                    row = {"target": name, "stream": stream, "concurrency": c, "round": rnd + 1, **res}
                    if name == "direct":
                        base = res
                    elif base and res["p50_ms"] is not None and base["p50_ms"] is not None:
                        row["added_p50_ms"] = round(res["p50_ms"] - base["p50_ms"], 3)
                        row["added_p99_ms"] = round(res["p99_ms"] - base["p99_ms"], 3)
                        if stream and res["ttfb_p50_ms"] is not None and base["ttfb_p50_ms"] is not None:
                            row["added_ttfb_p50_ms"] = round(res["ttfb_p50_ms"] - base["ttfb_p50_ms"], 3)
                    log(
                        f"{'stream' if stream else 'plain '} c={c:<4} r{rnd + 1} {name:<8}"
                        f" {res['rps']:>8} req/s"
                        f"  p50 {fmt(res['p50_ms'])} ms  p99 {fmt(res['p99_ms'])} ms"
                        f"  ttfb {fmt(res['ttfb_p50_ms'])} ms  cpu {fmt(res['cpu_ms_per_req'])} ms/req"
                        f"  errors {res['errors']}"
                    )
                    rows.append(row)
    return rows


def _median(xs: list[float]) -> float | None:
    return round(statistics.median(xs), 3) if xs else None


def summarize(rows: list[dict[str, Any]], concs: list[int], rounds: int) -> dict[str, Any]:
    """Per concurrency: the plain (non-streamed) rows' figures and LiteLLM-over-gateway ratios.

    Each ratio is taken within a round (rows run side by side); with several rounds the summary
    gives every round's ratio (``…_rounds``), their median (the headline figure) and the ratio
    of the two targets' median figures (``…_of_medians``); single figures are medians over rounds.
    """
    by: dict[tuple[str, bool, int, int], dict[str, Any]] = {
        (r["target"], r["stream"], r["concurrency"], r["round"]): r for r in rows
    }

    def med(rs: list[dict[str, Any]], key: str) -> float | None:
        return _median([r[key] for r in rs if r.get(key) is not None])

    def of(target: str, stream: bool, c: int) -> list[dict[str, Any]]:  # that target's rows, by round
        return [r for i in range(1, rounds + 1) if (r := by.get((target, stream, c, i))) is not None]

    summary: dict[str, Any] = {}
    for c in concs:
        out: dict[str, Any] = {}
        g_rows, l_rows, s_rows = of("gateway", False, c), of("litellm", False, c), of("gateway", True, c)

        if g_rows:
            out["cpu_ms_per_req_gateway"] = med(g_rows, "cpu_ms_per_req")
        if g_rows and l_rows:
            out["throughput_ratio_gateway_over_litellm"] = _median(
                [g["rps"] / lt["rps"] for g, lt in zip(g_rows, l_rows, strict=True) if lt["rps"]]
            )
            out["added_p50_ms_gateway"] = med(g_rows, "added_p50_ms")
            out["added_p50_ms_litellm"] = med(l_rows, "added_p50_ms")
            out["cpu_ms_per_req_litellm"] = med(l_rows, "cpu_ms_per_req")
            for name, key in (
                ("cpu_litellm_over_gateway", "cpu_ms_per_req"),
                ("added_p50_litellm_over_gateway", "added_p50_ms"),
            ):
                per_round = [
                    round(lt[key] / g[key], 1)
                    for g, lt in zip(g_rows, l_rows, strict=True)
                    if g.get(key) and lt.get(key)
                ]
                if not per_round:
                    continue
                out[name] = round(statistics.median(per_round), 1)
                if rounds > 1:
                    out[f"{name}_rounds"] = per_round
                    gm, lm = med(g_rows, key), med(l_rows, key)
                    if gm and lm:
                        out[f"{name}_of_medians"] = round(lm / gm, 1)
        if s_rows:
            out["added_ttfb_p50_ms_gateway"] = med(s_rows, "added_ttfb_p50_ms")
        if out:
            summary[f"c{c}"] = out
    return summary


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--concurrency", default="1,32,128")
    ap.add_argument("--duration", type=float, default=5.0)
    ap.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="run every (mode, concurrency) this many times, all targets in turn each time",
    )
    ap.add_argument("--adapters", type=int, default=3)
    ap.add_argument(
        "--limiter", choices=["redis", "memory"], default="redis", help="where limits live (both)"
    )
    ap.add_argument(
        "--litellm-limiter",
        choices=["same", "redis", "memory"],
        default="same",
        help="LiteLLM's rate limits in Redis or in its worker's memory (default: as --limiter)",
    )
    ap.add_argument("--skip-litellm", action="store_true")
    ap.add_argument(
        "--litellm",
        default=None,
        help="LiteLLM executable or its virtualenv (else $LORAPLANE_LITELLM, else <repo>/.venv-litellm, "
        "else installed into $LORAPLANE_BENCH_DIR/litellm-venv)",
    )
    ap.add_argument("--modes", default="plain,stream", help="plain, stream or both")
    ap.add_argument(
        "--profile", default=None, help="folder: py-spy (collapsed stacks) of the gateway per row"
    )
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "gateway.json"))
    args = ap.parse_args()
    concs = [int(x) for x in args.concurrency.split(",")]
    from simulator.procs import start_simulators, stop_all

    modes = tuple(m == "stream" for m in args.modes.split(","))
    profile = Path(args.profile) if args.profile else None
    if profile is not None:
        profile.mkdir(parents=True, exist_ok=True)
    exe = None if args.skip_litellm else (find_litellm(args.litellm) or ensure_litellm())
    litellm_limiter = args.limiter if args.litellm_limiter == "same" else args.litellm_limiter
    redis_url = ls.redis_server_url() if "redis" in (args.limiter, litellm_limiter) else None
    la_start = load_avg()
    work = Path(tempfile.mkdtemp(prefix="lp-bench-gw-"))
    sims = start_simulators(1, extra_args=["--zero-latency", "--max-loras", "8", "--max-num-seqs", "1024"])
    procs: list[ManagedProcess] = []
    try:
        sim_url = sims[0].url
        log(f"simulator {sim_url}; starting registry + gateway (limiter: {args.limiter}) …")
        if exe is not None:
            log(f"LiteLLM's limiter: {litellm_limiter}")
        ps, gw_url, key, models = setup_platform(work, sim_url, args.adapters, args.limiter)
        procs += ps
        mapping = lora_names(sim_url)
        sim_pid, gw_pid = sims[0].pid, ps[0].pid
        assert sim_pid is not None and gw_pid is not None
        targets: dict[str, tuple[str, str, list[str], int]] = {
            "direct": (f"{sim_url}/v1/chat/completions", "none", [mapping[m] for m in models], sim_pid),
            "gateway": (f"{gw_url}/v1/chat/completions", key, models, gw_pid),
        }
        if exe is not None:
            log("starting LiteLLM (one worker) …")
            lurl_redis = ls.redis_server_url() if litellm_limiter == "redis" else None
            lproc, lurl = start_litellm(exe, work, sim_url, {m: mapping[m] for m in models}, lurl_redis)
            procs.append(lproc)
            assert lproc.pid is not None
            targets["litellm"] = (f"{lurl}/v1/chat/completions", "sk-bench-tenant", models, lproc.pid)
        rows = asyncio.run(measure(targets, concs, args.duration, profile, modes, redis_url, args.rounds))
    finally:
        stop_procs(procs, grace_s=15)
        stop_all(sims)
    summary = summarize(rows, concs, args.rounds)
    out = {
        "benchmark": "gateway",
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "load_avg_start": la_start,
            "load_avg_end": load_avg(),
        },
        "settings": {
            "duration_s": args.duration,
            "rounds": args.rounds,
            "adapters": args.adapters,
            "limiter": args.limiter,
            "litellm_limiter": litellm_limiter if exe else None,
            "litellm": litellm_version(exe) if exe else None,
            "max_tokens": 16,
        },
        "rows": rows,
        "summary": summary,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=2) + "\n")
    print()
    print(
        f"{'mode':<7}{'conc':>5}{'rnd':>4}  {'target':<8}{'req/s':>9}{'p50 ms':>9}{'p99 ms':>9}"
        f"{'+p50':>8}{'+p99':>8}"
        f"{'ttfb':>8}{'+ttfb':>8}{'cpu ms/req':>12}{'redis/req':>11}"
    )
    for r in rows:
        print(
            f"{'stream' if r['stream'] else 'plain':<7}{r['concurrency']:>5}{r['round']:>4}"
            f"  {r['target']:<8}{r['rps']:>9}"
            f"{fmt(r['p50_ms']):>9}{fmt(r['p99_ms']):>9}{fmt(r.get('added_p50_ms')):>8}{fmt(r.get('added_p99_ms')):>8}"
            f"{fmt(r['ttfb_p50_ms']):>8}{fmt(r.get('added_ttfb_p50_ms')):>8}{fmt(r.get('cpu_ms_per_req')):>12}"
            f"{fmt(r.get('redis_cmds_per_req')):>11}"
        )
    print(f"\nsummary: {json.dumps(summary)}\nwrote {args.out}")
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
