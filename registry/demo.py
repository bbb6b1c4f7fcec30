"""The simulated base model ``demo-base`` (SPEC §12) that `loraplane up` always registers."""

from __future__ import annotations

from typing import Any

DEMO_TARGET_MODULES = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
DEMO_MODULE_SHAPES: dict[str, list[int]] = {
    "q_proj": [256, 256],
    "k_proj": [256, 256],
    "v_proj": [256, 256],
    "o_proj": [256, 256],
    "gate_proj": [256, 512],
    "up_proj": [256, 512],
    "down_proj": [512, 256],
}


def demo_base_model(name: str = "demo-base") -> dict[str, Any]:
    """Body of ``POST /admin/v1/base-models`` for the simulated base model."""
    return {
        "name": name,
        "hf_id": "loraplane/demo-base" if name == "demo-base" else f"loraplane/{name}",
        "max_lora_rank": 64,
        "target_modules": list(DEMO_TARGET_MODULES),
        "module_shapes": {k: list(v) for k, v in DEMO_MODULE_SHAPES.items()},
    }
