"""Where a simulated engine's adapters come from: GPU slots, the host (CPU) cache, or disk.

vLLM keeps ``max_loras`` adapters in GPU slots and ``max_cpu_loras`` in host memory, both LRU
(``vllm/lora/worker_manager.py``, ``model_manager.py``); the engine model (``engine.py``) keeps
both caches. This module prices the moves and counts them per tier:

- **cpu → gpu**: the weights copied into a slot, ``cpu_fixed_s + bytes / pcie_bytes_per_s`` —
  milliseconds. GPU slots are padded to ``max_lora_rank``, so a low-rank adapter on an engine
  with a high ``max_lora_rank`` copies ``max_lora_rank / rank`` times its own size;
- **disk → cpu → gpu**: re-read from ``lora_path`` (``TimingParams.load_cost``) — tens of
  milliseconds and up, inside the engine step.

``TierCosts`` is optional on ``EngineModel`` (``tiers``): without it a CPU-cache hit costs the
constant ``TimingParams.cpu_cache_reload_s``, as before. The engine counts the moves
(``total_cpu_reloads``; ``total_disk_loads``, add_lora's reads included).
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(slots=True)
class TierCosts:
    cpu_fixed_s: float = 0.001
    pcie_bytes_per_s: float = 16e9
    max_lora_rank: int = 0  # the engine pads GPU slots to it (0: no padding)
    ranks: dict[str, int] = field(default_factory=dict)  # lora_name → rank (padding)

    def cpu_to_gpu_s(self, name: str, size_bytes: int) -> float:
        rank = self.ranks.get(name, 0)
        pad = self.max_lora_rank / rank if 0 < rank < self.max_lora_rank else 1.0
        return self.cpu_fixed_s + size_bytes * pad / self.pcie_bytes_per_s
