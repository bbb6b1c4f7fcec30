"""Write small PEFT LoRA adapter directories with numpy (tests, benchmarks, `up --demo`).

Layout as PEFT saves it: ``adapter_config.json`` + ``adapter_model.safetensors`` with tensors
``base_model.model.model.layers.{i}.{self_attn|mlp}.{module}.lora_{A|B}.weight``,
``lora_A`` of shape ``[r, in]`` and ``lora_B`` of shape ``[out, r]``.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from registry.demo import DEMO_MODULE_SHAPES

_ATTN = {"q_proj", "k_proj", "v_proj", "o_proj"}
_NP_DTYPES = {"F16": np.float16, "F32": np.float32, "BF16": np.uint16}


def tensor_name(layer: int, module: str, ab: str) -> str:
    block = "self_attn" if module in _ATTN else "mlp"
    return f"base_model.model.model.layers.{layer}.{block}.{module}.lora_{ab}.weight"


def write_safetensors(path: Path, tensors: Mapping[str, np.ndarray], dtypes: Mapping[str, str]) -> None:
    """Write a safetensors file (8-byte LE header length, JSON header, raw little-endian data)."""
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    blobs: list[bytes] = []
    for name, arr in tensors.items():
        raw = np.ascontiguousarray(arr).astype(arr.dtype.newbyteorder("<"), copy=False).tobytes()
        header[name] = {
            "dtype": dtypes[name],
            "shape": list(arr.shape),
            "data_offsets": [offset, offset + len(raw)],
        }
        offset += len(raw)
        blobs.append(raw)
    hb = json.dumps(header, separators=(",", ":")).encode()
    hb += b" " * ((8 - len(hb) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hb)))
        f.write(hb)
        for b in blobs:
            f.write(b)


def write_adapter(
    path: str | Path,
    *,
    rank: int = 8,
    alpha: float = 16,
    target_modules: Iterable[str] = ("q_proj", "v_proj"),
    module_shapes: Mapping[str, list[int]] = DEMO_MODULE_SHAPES,
    layers: int = 2,
    dtype: str = "F16",
    seed: int = 0,
    base_model_name_or_path: str | None = "loraplane/demo-base",
    config_overrides: Mapping[str, Any] | None = None,
    pad_bytes: int = 0,
) -> Path:
    """Create a valid adapter directory at ``path`` and return it.

    ``config_overrides`` are merged into ``adapter_config.json`` (use to craft bad configs).
    ``pad_bytes`` adds an extra ``…layers.{layers}.…`` tensor pair sized to reach roughly that
    many extra bytes (for large-upload benchmarks), still valid.
    """
    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    modules = list(target_modules)
    rng = np.random.default_rng(seed)
    np_dtype = _NP_DTYPES[dtype]
    tensors: dict[str, np.ndarray] = {}
    dtypes: dict[str, str] = {}

    def _mk(shape: tuple[int, ...]) -> np.ndarray:
        if dtype == "BF16":
            f32 = (rng.standard_normal(shape) * 0.02).astype(np.float32)
            return (f32.view(np.uint32) >> 16).astype(np.uint16)
        return (rng.standard_normal(shape) * 0.02).astype(np_dtype)

    n_layers = layers
    for layer in range(n_layers):
        for m in modules:
            d_in, d_out = module_shapes.get(m, [256, 256])
            for ab, shape in (("A", (rank, d_in)), ("B", (d_out, rank))):
                name = tensor_name(layer, m, ab)
                tensors[name] = _mk(shape)
                dtypes[name] = dtype
    if pad_bytes > 0 and modules:
        m = modules[0]
        d_in, d_out = module_shapes.get(m, [256, 256])
        itemsize = 4 if dtype == "F32" else 2
        extra_layers = max(1, pad_bytes // ((rank * d_in + d_out * rank) * itemsize))
        for layer in range(n_layers, n_layers + extra_layers):
            for ab, shape in (("A", (rank, d_in)), ("B", (d_out, rank))):
                name = tensor_name(layer, m, ab)
                tensors[name] = np.zeros(shape, dtype=np_dtype)
                dtypes[name] = dtype
    write_safetensors(out / "adapter_model.safetensors", tensors, dtypes)
    config: dict[str, Any] = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "r": rank,
        "lora_alpha": alpha,
        "lora_dropout": 0.0,
        "target_modules": modules,
        "bias": "none",
        "use_dora": False,
        "use_rslora": False,
        "modules_to_save": None,
        "fan_in_fan_out": False,
        "inference_mode": True,
    }
    if base_model_name_or_path is not None:
        config["base_model_name_or_path"] = base_model_name_or_path
    if config_overrides:
        config.update(config_overrides)
    (out / "adapter_config.json").write_text(json.dumps(config, indent=2))
    return out
