"""Options of the simulator's engine flavours (``--engine sglang|ray-serve|trtllm``); the vLLM
flavour (the default) needs none. Pure data: ``SimConfig.flavour`` holds one."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

SimEngine = Literal["vllm", "sglang", "ray-serve", "trtllm"]
SIM_ENGINES: tuple[str, ...] = get_args(SimEngine)


@dataclass
class FlavourOptions:
    # sglang: --max-loaded-loras (None: unlimited, SGLang's default); --max-loras-per-batch is
    # the simulator's --max-loras
    max_loaded_loras: int | None = None
    # ray-serve: LLMConfig.lora_config (dynamic_lora_loading_path: s3://bucket/prefix, or
    # file:///dir for the simulator only), max_num_adapters_per_replica, and where the replica's
    # disk cache lives (Ray: <ray tmp>/llm/lora/cache)
    dynamic_lora_loading_path: str | None = None
    max_num_adapters_per_replica: int = 16
    lora_cache_dir: str | None = None
