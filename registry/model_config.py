"""A base model's spec from its Hugging Face ``config.json`` (SPEC §3's ``module_shapes``).

Used by ``loraplane up --engine vllm --model DIR`` (:mod:`loraplane.engine_launch`) and by
``loraplane base-models add --config PATH|HF_ID`` (:mod:`registry.cli.base_models`): the shapes
``[in, out]`` of the LoRA-able linear layers of a Llama-style decoder (Llama, Qwen, Mistral …),
derived from ``hidden_size``, ``intermediate_size``, ``num_attention_heads``,
``num_key_value_heads`` and ``head_dim``.
"""

from __future__ import annotations

import json
from pathlib import Path

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
