"""``loraplane up --sim-engine NAME``: simulated replicas of one engine and the pool that drives
them (``vllm``, the default; ``sglang``; ``ray-serve``; ``trtllm``).

- ``vllm`` and ``trtllm``: ``--replicas`` simulated replicas reading the router's local staging
  directory (TensorRT-LLM's host cache mirrors the pool's ``max_adapters``);
- ``sglang``: the same, SGLang's ``--max-loaded-loras`` = the pool's ``max_adapters``;
- ``ray-serve``: one simulated Ray Serve LLM app (the pool is one endpoint; its replicas are
  Ray's business) whose ``dynamic_lora_loading_path`` is ``<data dir>/published``, where the
  router publishes verified adapters (a real app reads an S3 prefix instead).
"""

from __future__ import annotations

from pathlib import Path

from router import PoolConfig
from simulator.flavour_options import SIM_ENGINES
from simulator.procs import SimProcess, start_simulators

__all__ = ["SIM_ENGINES", "start_sim_pool"]


def start_sim_pool(
    sim_engine: str, replicas: int, base_model: str, data_dir: Path, extra_args: list[str] | None = None
) -> tuple[list[SimProcess], PoolConfig]:
    """Start the simulated replicas of ``sim_engine`` (ready when this returns) and their pool."""
    if sim_engine not in SIM_ENGINES:
        raise ValueError(f"unknown simulated engine {sim_engine!r}; one of {', '.join(SIM_ENGINES)}")
    max_adapters = int(PoolConfig.model_fields["max_adapters"].default)  # the pool's default
    args = list(extra_args or [])
    staging: dict[str, str] = {"mode": "local"}
    if sim_engine == "sglang":
        args += ["--max-loaded-loras", str(max_adapters)]
    elif sim_engine == "trtllm":
        args += ["--max-cpu-loras", str(max_adapters)]
    elif sim_engine == "ray-serve":
        published = (data_dir / "published").resolve()
        published.mkdir(parents=True, exist_ok=True)
        uri = f"file://{published}"
        args += ["--dynamic-lora-loading-path", uri, "--lora-cache-dir", str(data_dir / "ray-lora-cache")]
        staging = {"mode": "publish", "uri": uri}
        replicas = 1
    sims = start_simulators(replicas, model=base_model, extra_args=args, engine=sim_engine)
    pool = PoolConfig(
        name="local",
        base_model=base_model,
        engine=sim_engine,  # type: ignore[arg-type]
        urls=[p.url for p in sims],
        staging=staging,  # type: ignore[arg-type]
    )
    return sims, pool
