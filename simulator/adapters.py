"""Read and validate a PEFT LoRA adapter directory the way vLLM does at load (as vLLM 0.32 does).

``inspect_adapter(lora_path, max_lora_rank)`` returns an ``AdapterFiles`` (weights sha256 and
size) or raises ``AdapterNotFound`` (vLLM's 404: no ``adapter_config.json``) or
``AdapterRejected`` (vLLM's 500 ``Call to add_lora method failed: <reason>``).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

_WEIGHT_FILES = ("adapter_model.safetensors", "adapter_model.bin", "adapter_model.pt")
_ALLOWED_MODULES_TO_SAVE = {"classifier", "score"}
#: LoRA-capable modules of a Llama-like model (packed names expand like vLLM's).
SUPPORTED_MODULES = {
    "q_proj",
    "k_proj",
    "v_proj",
    "o_proj",
    "qkv_proj",
    "gate_proj",
    "up_proj",
    "down_proj",
    "gate_up_proj",
    "lm_head",
    "embed_tokens",
}
_TENSOR_RE = re.compile(
    r"^base_model\.model\.(.+)\.(lora_A|lora_B|lora_embedding_A|lora_embedding_B)(?:\.weight)?$"
)


class AdapterNotFound(Exception):
    """No adapter_config.json at the path (vLLM: 404 ``No adapter found for <path>``)."""


class AdapterRejected(Exception):
    """Engine-side validation failure (vLLM ≥0.18: 500 ``Call to add_lora method failed``)."""


@dataclass(frozen=True, slots=True)
class AdapterFiles:
    path: str  # absolute directory
    weights_file: str
    sha256: str  # of the weights file: the adapter's identity for deterministic outputs
    size_bytes: int
    rank: int
    num_tensors: int


def resolve_path(lora_path: str) -> Path | None:
    """vLLM's ``get_adapter_absolute_path`` without the hub download (None = would download)."""
    if lora_path.startswith("~"):
        return Path(os.path.expanduser(lora_path))
    p = Path(lora_path)
    if p.is_absolute():
        return p
    if p.exists():
        return p.resolve()
    return None


_SUPPORTED_INITS = ("gaussian", "eva", "orthogonal", "mica", "lora_ga")


def _validate_config(cfg: dict[str, Any], max_lora_rank: int) -> None:
    """``PEFTHelper.from_dict`` + ``validate_legal`` (vllm/lora/peft_helper.py, 0.32)."""
    missing = sorted({"r", "lora_alpha", "target_modules"} - set(cfg))
    if missing:
        raise AdapterRejected(
            "Missing required configuration fields: {" + ", ".join(repr(m) for m in missing) + "}"
        )
    r = cfg.get("r")
    if not isinstance(r, int) or isinstance(r, bool) or r <= 0:
        raise AdapterRejected(f"LoRA rank `r` must be a positive integer, got {r}.")
    pattern = cfg.get("rank_pattern") or {}
    if not isinstance(pattern, dict):
        pattern = {}
    for key, rank in pattern.items():
        if not isinstance(rank, int) or rank <= 0:
            raise AdapterRejected(
                f"LoRA rank for `{key}` in `rank_pattern` must be a positive integer, got {rank}."
            )
    errors: list[str] = []
    mts = cfg.get("modules_to_save")
    if mts:
        unsupported = [m for m in mts if m not in _ALLOWED_MODULES_TO_SAVE]
        if unsupported:
            errors.append(
                "vLLM only supports modules_to_save being either None "
                'or ["classifier", "score"] for classification models. '
                f"Unsupported modules_to_save: {unsupported}"
            )
    if cfg.get("use_dora"):
        errors.append("vLLM does not yet support DoRA.")
    if cfg.get("lora_bias"):
        errors.append("vLLM does not support LoRA bias (lora_bias).")
    init = cfg.get("init_lora_weights", True)
    if isinstance(init, str) and init.lower() not in _SUPPORTED_INITS:
        errors.append(
            f"vLLM does not support init_lora_weights={init!r}."
            " Inits such as PiSSA, OLoRA, CorDA and LoftQ modify the base model"
            " weights when PEFT loads the adapter. Convert it to a regular LoRA"
            " adapter with PEFT's path_initial_model_for_weight_conversion, or"
            " set init_lora_weights to true if the served base model already"
            " contains the modified weights."
        )
    if cfg.get("alora_invocation_tokens"):
        errors.append("vLLM does not support Activated LoRA (aLoRA).")
    if cfg.get("layer_replication"):
        errors.append("vLLM does not support layer_replication.")
    if cfg.get("use_bdlora"):
        errors.append("vLLM does not support block-diagonal LoRA (BD-LoRA).")
    if cfg.get("use_qalora"):
        errors.append("vLLM does not support QALoRA.")
    max_rank = max([r, *pattern.values()])
    if max_rank > max_lora_rank:
        errors.append(f"LoRA rank {max_rank} is greater than max_lora_rank {max_lora_rank}.")
    if cfg.get("bias", "none") != "none":
        errors.append("Adapter bias is not supported.")
    if errors:
        raise AdapterRejected(" ".join(errors))


def read_safetensors_header(path: Path) -> dict[str, Any]:
    """Parse a safetensors header (8-byte little-endian length + JSON); ValueError if corrupt."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        raw = f.read(8)
        if len(raw) != 8:
            raise ValueError("Error while deserializing header: HeaderTooSmall")
        (n,) = struct.unpack("<Q", raw)
        if n > size - 8 or n > 100_000_000:
            raise ValueError("Error while deserializing header: HeaderTooLarge")
        try:
            header = json.loads(f.read(n))
        except (ValueError, UnicodeDecodeError):
            raise ValueError("Error while deserializing header: InvalidHeaderDeserialization") from None
    if not isinstance(header, dict):
        raise ValueError("Error while deserializing header: InvalidHeaderDeserialization")
    data_len = size - 8 - n
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        offs = meta.get("data_offsets") if isinstance(meta, dict) else None
        if not isinstance(offs, list) or len(offs) != 2 or offs[1] > data_len or offs[0] > offs[1]:
            raise ValueError("Error while deserializing header: InvalidOffset")
    return header


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def inspect_adapter(lora_path: str, max_lora_rank: int) -> AdapterFiles:
    """Validate the adapter at ``lora_path`` as vLLM's worker would; see module doc."""
    d = resolve_path(lora_path)
    if d is None or not (d / "adapter_config.json").is_file():
        raise AdapterNotFound(f"No adapter found for {lora_path}")
    try:
        cfg = json.loads((d / "adapter_config.json").read_text())
    except (OSError, ValueError) as exc:
        raise AdapterRejected(str(exc)) from None
    if not isinstance(cfg, dict):
        raise AdapterRejected("adapter_config.json is not a JSON object")
    _validate_config(cfg, max_lora_rank)
    weights = next((d / f for f in _WEIGHT_FILES if (d / f).is_file()), None)
    if weights is None:
        raise AdapterRejected(f"{d} doesn't contain tensors")
    num_tensors = 1
    if weights.suffix == ".safetensors":
        try:
            header = read_safetensors_header(weights)
        except (OSError, ValueError) as exc:
            raise AdapterRejected(str(exc)) from None
        names = [k for k in header if k != "__metadata__"]
        if not names:
            raise AdapterRejected(f"{d} doesn't contain tensors")
        num_tensors = len(names)
        bad_modules: list[str] = []
        for name in names:
            m = _TENSOR_RE.match(name)
            if m is None:
                raise AdapterRejected(f"{name} is unsupported LoRA weight")
            module_name = m.group(1)
            if module_name.rsplit(".", 1)[-1] not in SUPPORTED_MODULES and module_name not in bad_modules:
                bad_modules.append(module_name)
        if bad_modules:
            raise AdapterRejected(
                f"While loading {d}, expected target modules in {sorted(SUPPORTED_MODULES)} but received "
                f"{bad_modules}. Please verify that the loaded LoRA module is correct"
            )
    elif weights.stat().st_size == 0:
        raise AdapterRejected(f"{d} doesn't contain tensors")
    return AdapterFiles(
        path=str(d),
        weights_file=str(weights),
        sha256=_sha256(weights),
        size_bytes=weights.stat().st_size,
        rank=int(cfg["r"]),
        num_tensors=num_tensors,
    )


_ADDR_RE = re.compile(r" at 0x[0-9a-fA-F]+>")
_TRACE_RE = re.compile(r'\n?\s*File "[^"]+", line \d+, in \S+(\n\s+.*)?')
_PATH_PREFIX_RE = re.compile(r"/(?:home|usr|opt|var|tmp|root|lib|mnt|srv)(?:/[\w.\-]+)+")
_PATH_EXT_RE = re.compile(r"(?:/[\w\-]+)+/[\w\-]+\.\w+")


def sanitize_message(message: str) -> str:
    """vLLM's ``sanitize_message`` (entrypoints/serve/exception_handling/utils.py, verbatim rules)."""
    message = _ADDR_RE.sub(">", message)
    message = _TRACE_RE.sub("", message)
    message = _PATH_PREFIX_RE.sub("<path>", message)
    message = _PATH_EXT_RE.sub("<path>", message)
    return message.strip()
