"""Read and validate a PEFT LoRA adapter directory the way vLLM does at load (VLLM.md §7).

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
_UNSUPPORTED_INIT = {"pissa", "olora", "corda", "loftq"}


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


def _validate_config(cfg: dict[str, Any], max_lora_rank: int) -> None:
    missing = sorted({"r", "lora_alpha", "target_modules"} - set(cfg))
    if missing:
        raise AdapterRejected(
            "Missing required configuration fields: {" + ", ".join(repr(m) for m in missing) + "}"
        )
    errors: list[str] = []
    mts = cfg.get("modules_to_save")
    if mts and not set(mts) <= _ALLOWED_MODULES_TO_SAVE:
        errors.append(
            f"vLLM only supports modules_to_save being None or a subset of "
            f"{sorted(_ALLOWED_MODULES_TO_SAVE)}, got {mts}."
        )
    if cfg.get("use_dora"):
        errors.append("vLLM does not yet support DoRA.")
    if cfg.get("lora_bias"):
        errors.append("vLLM does not support LoRA bias (lora_bias).")
    init = cfg.get("init_lora_weights")
    if isinstance(init, str) and init.lower().split("_")[0] in _UNSUPPORTED_INIT:
        errors.append(f"vLLM does not support init_lora_weights={init}.")
    if cfg.get("alora_invocation_tokens"):
        errors.append("vLLM does not support aLoRA.")
    if cfg.get("layer_replication"):
        errors.append("vLLM does not support layer_replication.")
    if cfg.get("use_bdlora"):
        errors.append("vLLM does not support BD-LoRA.")
    if cfg.get("use_qalora"):
        errors.append("vLLM does not support QALoRA.")
    r = cfg.get("r")
    if not isinstance(r, int) or isinstance(r, bool) or r <= 0:
        errors.append(f"LoRA rank `r` must be a positive integer, got {r}.")
    elif r > max_lora_rank:
        errors.append(f"LoRA rank {r} is greater than max_lora_rank {max_lora_rank}.")
    if cfg.get("bias", "none") not in (None, "none"):
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
            module = m.group(1).rsplit(".", 1)[-1]
            if module not in SUPPORTED_MODULES and module not in bad_modules:
                bad_modules.append(module)
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


_PATH_PREFIX_RE = re.compile(r"(?<![\w<>])(?:~)?/(?:home|usr|opt|var|tmp|root|lib|mnt|srv)(?:/[^\s'\",;:]*)?")
_PATH_EXT_RE = re.compile(r"(?<![\w<>])[\w.~-]*/[\w./-]*\w\.[A-Za-z0-9]{1,10}\b")


def sanitize_message(message: str) -> str:
    """vLLM ≥0.27 ``sanitize_message``: system paths and ``dir/name.ext`` become ``<path>``."""
    out = _PATH_PREFIX_RE.sub(_strip_trailing, message)
    return _PATH_EXT_RE.sub("<path>", out)


def _strip_trailing(m: re.Match[str]) -> str:
    text = m.group(0)
    tail = ""
    while text and text[-1] in ".)]}":
        tail = text[-1] + tail
        text = text[:-1]
    return "<path>" + tail
