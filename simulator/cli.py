"""``loraplane simulate`` / ``python -m simulator``: run one simulated vLLM replica.

See ``simulator/README.md`` for every flag, the timing defaults and fault injection.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time

import typer

from simulator.behaviours import ENV_VAR as BEHAVIOURS_ENV
from simulator.behaviours import BehaviourError, load_behaviours
from simulator.config import FaultState, SimConfig
from simulator.engine import ALLOWED_LORA_RANKS, TimingParams
from simulator.flavour_options import SIM_ENGINES, FlavourOptions

PARENT_ENV = "LORAPLANE_SIM_PARENT_PID"
_D = TimingParams()


def parse_lora_modules(items: list[str]) -> list[tuple[str, str]]:
    """vLLM's ``--lora-modules`` item forms: ``name=path`` or JSON ``{"name","path",...}``."""
    out: list[tuple[str, str]] = []
    for item in items:
        for part in item.split() if not item.lstrip().startswith("{") else [item]:
            if part.lstrip().startswith("{"):
                obj = json.loads(part)
                out.append((str(obj["name"]), str(obj["path"])))
            elif "=" in part and "," not in part:
                name, path = part.split("=", 1)
                out.append((name, path))
            else:
                raise typer.BadParameter(f"invalid LoRA module {part!r}: use name=path or JSON")
    return out


def runtime_lora_from_env(default: bool = True) -> bool:
    """``VLLM_ALLOW_RUNTIME_LORA_UPDATING`` as vLLM reads it (``1``/``true``); unset → ``default``."""
    raw = os.environ.get("VLLM_ALLOW_RUNTIME_LORA_UPDATING")
    if raw is None:
        return default
    return raw.strip().lower() in ("1", "true")


def _watch_parent(pid: int) -> None:
    """Exit when the process that started us is gone (no orphans from crashed test runs)."""

    def loop() -> None:
        while True:
            if os.getppid() != pid:
                os._exit(0)
            time.sleep(0.5)

    threading.Thread(target=loop, name="parent-watch", daemon=True).start()


def simulate(
    engine: str = typer.Option(
        "vllm", "--engine", help=f"Engine whose HTTP API to speak: {', '.join(SIM_ENGINES)}."
    ),
    max_loaded_loras: int | None = typer.Option(
        None, "--max-loaded-loras", help="sglang: adapters kept registered (its LRU; default unlimited)."
    ),
    dynamic_lora_loading_path: str | None = typer.Option(
        None,
        "--dynamic-lora-loading-path",
        help="ray-serve: where adapters are published, s3://bucket/prefix (or file:///dir, simulator only).",
    ),
    max_num_adapters_per_replica: int = typer.Option(
        16, "--max-num-adapters-per-replica", min=1, help="ray-serve: the replica's LRU of loaded adapters."
    ),
    lora_cache_dir: str | None = typer.Option(
        None, "--lora-cache-dir", help="ray-serve: the replica's disk cache (default: a temp dir)."
    ),
    port: int = typer.Option(8000, "--port", help="TCP port to listen on."),
    host: str = typer.Option("127.0.0.1", "--host", help="Address to bind."),
    model: str = typer.Option("demo-base", "--model", help="Served base model name."),
    max_model_len: int = typer.Option(8192, "--max-model-len", help="Context length (tokens)."),
    max_loras: int = typer.Option(4, "--max-loras", help="GPU LoRA slots = distinct adapters per batch."),
    max_cpu_loras: int | None = typer.Option(
        None, "--max-cpu-loras", help="CPU adapter cache size (default: = --max-loras, like vLLM)."
    ),
    max_lora_rank: int = typer.Option(64, "--max-lora-rank", help=f"One of {list(ALLOWED_LORA_RANKS)}."),
    max_num_seqs: int = typer.Option(256, "--max-num-seqs", help="Max running sequences."),
    kv_cache_tokens: int = typer.Option(
        _D.kv_cache_tokens, "--kv-cache-tokens", help="KV cache capacity (tokens)."
    ),
    api_key: str | None = typer.Option(
        None, "--api-key", help="Require 'Authorization: Bearer KEY' on /v1*."
    ),
    allow_runtime_lora: bool | None = typer.Option(
        None,
        "--allow-runtime-lora/--no-allow-runtime-lora",
        help="Expose /v1/load_lora_adapter (default: VLLM_ALLOW_RUNTIME_LORA_UPDATING if set, else on).",
    ),
    zero_latency: bool = typer.Option(False, "--zero-latency", help="Every duration zero (tests)."),
    time_scale: float = typer.Option(1.0, "--time-scale", help="Multiply every duration (0.1 = 10x faster)."),
    load_fixed_s: float = typer.Option(
        _D.load_fixed_s, "--load-fixed-s", help="Fixed cost of an adapter read."
    ),
    load_bytes_per_s: float = typer.Option(
        _D.load_bytes_per_s, "--load-bytes-per-s", help="Adapter read bandwidth."
    ),
    cpu_cache_reload_s: float = typer.Option(
        _D.cpu_cache_reload_s, "--cpu-cache-reload-s", help="CPU cache → GPU slot copy."
    ),
    prefill_s_per_token: float = typer.Option(_D.prefill_s_per_token, "--prefill-s-per-token"),
    decode_base_s: float = typer.Option(_D.decode_base_s, "--decode-base-s", help="Step time, tiny batch."),
    decode_per_seq_s: float = typer.Option(
        _D.decode_per_seq_s, "--decode-per-seq-s", help="Step time per seq."
    ),
    lora_modules: list[str] = typer.Option(
        [], "--lora-modules", help="Static adapter name=path (repeatable)."
    ),
    default_max_tokens: int = typer.Option(16, "--default-max-tokens", help="max_tokens when not given."),
    seed: int = typer.Option(0, "--seed", help="Mixed into every generation."),
    enable_server_load_tracking: bool = typer.Option(False, "--enable-server-load-tracking"),
    wrap_worker_errors: bool = typer.Option(
        False, "--wrap-worker-errors", help="Word load failures like vLLM's multiproc executor."
    ),
    enable_fault_control: bool = typer.Option(
        False, "--enable-fault-control", help="Expose /_sim/* endpoints."
    ),
    fail_loads: int = typer.Option(0, "--fail-loads", help="Fail the next N load calls."),
    fail_load_status: int = typer.Option(500, "--fail-load-status", help="404 or 500."),
    slow_load_s: float = typer.Option(0.0, "--slow-load-s", help="Extra seconds per load call."),
    start_dead: bool = typer.Option(False, "--start-dead", help="/health 503 from the start."),
    die_after_tokens: int | None = typer.Option(
        None, "--die-after-tokens", help="Drop streams after K tokens."
    ),
    die_streams: int | None = typer.Option(None, "--die-streams", help="... only the next N streams."),
    stall_s: float = typer.Option(0.0, "--stall-s", help="Pause every request S seconds ..."),
    stall_after_tokens: int = typer.Option(1, "--stall-after-tokens", help="... after K tokens."),
    exit_after_requests: int | None = typer.Option(
        None, "--exit-after-requests", help="Exit after N requests."
    ),
    behaviours: str | None = typer.Option(
        None,
        "--behaviours",
        envvar=BEHAVIOURS_ENV,
        help="Simulated behaviours per adapter: a JSON object inline (starts with '{') or a file path.",
    ),
    log_level: str = typer.Option("warning", "--log-level"),
) -> None:
    """Run one simulated replica (vLLM's HTTP API, or --engine sglang|ray-serve|trtllm's; LoRA slots,
    load latency, faults)."""
    import uvicorn

    from simulator.flavours import build_app

    if engine not in SIM_ENGINES:
        raise typer.BadParameter(f"one of {', '.join(SIM_ENGINES)}", param_hint="--engine")
    if engine == "ray-serve" and not (dynamic_lora_loading_path or "").startswith(("s3://", "file:///")):
        raise typer.BadParameter(
            "ray-serve needs s3://bucket/prefix (or file:///dir)", param_hint="--dynamic-lora-loading-path"
        )
    if engine in ("ray-serve", "trtllm") and lora_modules:
        raise typer.BadParameter(f"{engine} has no static adapters", param_hint="--lora-modules")
    if engine == "sglang" and max_cpu_loras is None:  # SGLang holds every registered adapter in host memory
        max_cpu_loras = max(max_loras, max_loaded_loras or 1024)
    if max_lora_rank not in ALLOWED_LORA_RANKS:
        raise typer.BadParameter(f"--max-lora-rank must be one of {list(ALLOWED_LORA_RANKS)}")
    timing_kw = dict(
        max_num_seqs=max_num_seqs,
        max_loras=max_loras,
        max_cpu_loras=max_cpu_loras,
        kv_cache_tokens=kv_cache_tokens,
    )
    try:
        if zero_latency:
            timing = TimingParams.zero(**timing_kw)
        else:
            timing = TimingParams(
                load_fixed_s=load_fixed_s,
                load_bytes_per_s=load_bytes_per_s,
                cpu_cache_reload_s=cpu_cache_reload_s,
                prefill_s_per_token=prefill_s_per_token,
                decode_base_s=decode_base_s,
                decode_per_seq_s=decode_per_seq_s,
                time_scale=time_scale,
                **timing_kw,  # type: ignore[arg-type]
            )
        faults = FaultState()
        faults.update(
            {
                "fail_loads": fail_loads,
                "fail_load_status": fail_load_status,
                "slow_load_s": slow_load_s,
                "dead": start_dead,
                "die_after_tokens": die_after_tokens,
                "die_streams": die_streams,
                "stall_s": stall_s,
                "stall_after_tokens": stall_after_tokens,
                "exit_after_requests": exit_after_requests,
            }
        )
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None
    try:
        faults.behaviours = load_behaviours(behaviours or "")
    except BehaviourError as exc:
        raise typer.BadParameter("\n  ".join(exc.problems), param_hint="--behaviours") from None
    config = SimConfig(
        model=model,
        max_model_len=max_model_len,
        timing=timing,
        max_lora_rank=max_lora_rank,
        api_key=api_key or os.environ.get("VLLM_API_KEY") or None,
        allow_runtime_lora=runtime_lora_from_env() if allow_runtime_lora is None else allow_runtime_lora,
        lora_modules=parse_lora_modules(lora_modules),
        enable_server_load_tracking=enable_server_load_tracking,
        enable_fault_control=enable_fault_control,
        faults=faults,
        default_max_tokens=default_max_tokens,
        seed=seed,
        wrap_worker_errors=wrap_worker_errors,
        engine=engine,
        flavour=FlavourOptions(
            max_loaded_loras=max_loaded_loras,
            dynamic_lora_loading_path=dynamic_lora_loading_path,
            max_num_adapters_per_replica=max_num_adapters_per_replica,
            lora_cache_dir=lora_cache_dir,
        ),
    )
    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    parent = os.environ.get(PARENT_ENV)
    if parent and parent.isdigit():
        _watch_parent(int(parent))
    app = build_app(config, exit_process=True)  # static adapters load before we listen
    uv = uvicorn.Config(
        app,
        host=host,
        port=port,
        loop="uvloop",
        http="httptools",
        lifespan="on",
        log_level=log_level.lower(),
        access_log=False,
        timeout_graceful_shutdown=2,
        backlog=2048,
    )
    uvicorn.Server(uv).run()


def main() -> None:
    typer.run(simulate)
