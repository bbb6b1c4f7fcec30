"""Validation of PEFT LoRA adapter artifacts against a base model (SPEC §3, §13).

``validate_adapter(config_bytes, weights, base)`` checks ``adapter_config.json`` and the
parsed safetensors header (see :mod:`registry.safetensors_header`) and either returns a
:class:`ValidatedAdapter` or raises :class:`kit.errors.InvalidAdapter` listing **every**
problem found, each a sentence naming the file and the field, option or tensor at fault.

``check_filename(name)`` applies the upload filename rule and returns a problem or None.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

from kit.errors import InvalidAdapter
from kit.inputs import json_problem, parse_json
from registry.safetensors_header import (
    SafetensorsHeaderParser,
    SafetensorsInfo,
    TensorInfo,
    parse_bytes,
)
from registry.snapshot import CONFIG_FILE, WEIGHTS_FILE

__all__ = [
    "ALLOWED_DTYPES",
    "CONFIG_FILE",
    "MAX_CONFIG_BYTES",
    "WEIGHTS_FILE",
    "BaseModelSpec",
    "SafetensorsHeaderParser",
    "SafetensorsInfo",
    "TensorInfo",
    "ValidatedAdapter",
    "cap_problems",
    "check_filename",
    "parse_bytes",
    "validate_adapter",
]

ALLOWED_DTYPES = ("F16", "BF16", "F32")
MAX_CONFIG_BYTES = 1024 * 1024
MAX_PROBLEMS = 200
_FILENAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_MAX_FILENAME = 255
_CFG = CONFIG_FILE
_W = WEIGHTS_FILE


@dataclass
class BaseModelSpec:
    name: str
    hf_id: str
    max_lora_rank: int
    target_modules: list[str]
    module_shapes: dict[str, list[int]] | None = None


@dataclass
class ValidatedAdapter:
    rank: int
    lora_alpha: float
    target_modules: list[str]


def cap_problems(problems: list[str], limit: int = MAX_PROBLEMS) -> list[str]:
    """At most ``limit`` problems, the rest summarised in one last line (a huge bad file
    must not turn into a megabyte of error text)."""
    if len(problems) <= limit:
        return problems
    return [*problems[:limit], f"… and {len(problems) - limit} more problems"]


def check_filename(name: str) -> str | None:
    """Problem text if ``name`` may not be an artifact file name, else None."""
    if not name:
        return "file name is empty"
    if len(name) > _MAX_FILENAME:
        return f"file name {name[:40]!r}… is longer than {_MAX_FILENAME} characters"
    if ".." in name:
        return f"file name {name!r} contains '..'"
    if "/" in name or "\\" in name:
        return f"file name {name!r} is a path; send the bare file name"
    if not _FILENAME_RE.match(name):
        return (
            f"file name {name!r} is not allowed: use letters, digits, '.', '_' and '-', "
            "starting with a letter or digit"
        )
    return None


def validate_adapter(
    config_bytes: bytes | None, weights: SafetensorsInfo | None, base: BaseModelSpec
) -> ValidatedAdapter:
    """Check an adapter's config and weights header; raise InvalidAdapter with every problem."""
    problems: list[str] = []
    cfg = _check_config(config_bytes, base, problems)
    _check_weights(weights, cfg, base, problems)
    if problems:
        raise InvalidAdapter(cap_problems(problems))
    assert cfg.rank is not None and cfg.alpha is not None and cfg.modules is not None
    return ValidatedAdapter(rank=cfg.rank, lora_alpha=cfg.alpha, target_modules=cfg.modules)


# --------------------------------------------------------------------------- config


@dataclass
class _Config:
    rank: int | None = None
    alpha: float | None = None
    modules: list[str] | None = None


def _check_config(raw: bytes | None, base: BaseModelSpec, p: list[str]) -> _Config:
    out = _Config()
    if raw is None:
        p.append(f"missing required file {_CFG}")
        return out
    if len(raw) > MAX_CONFIG_BYTES:
        p.append(f"{_CFG}: file is larger than {MAX_CONFIG_BYTES} bytes")
        return out
    try:
        cfg = parse_json(raw.decode("utf-8"))  # NaN / Infinity and a nesting too deep: ValueError
    except UnicodeDecodeError:
        p.append(f"{_CFG}: not UTF-8 text")
        return out
    except ValueError as e:
        p.append(f"{_CFG}: not valid JSON: {e}")
        return out
    if not isinstance(cfg, dict):
        p.append(f"{_CFG}: must be a JSON object")
        return out
    unsafe = json_problem(cfg)  # deep nesting, NUL / control characters, numbers out of range
    if unsafe is not None:
        p.append(f"{_CFG}: {unsafe[0] or 'the file'}: {unsafe[1]}")
        return out

    peft_type = cfg.get("peft_type")
    if peft_type != "LORA":
        p.append(f"{_CFG}: peft_type must be 'LORA', got {peft_type!r}")

    r = cfg.get("r")
    if "r" not in cfg:
        p.append(f"{_CFG}: r is missing")
    elif not isinstance(r, int) or isinstance(r, bool):
        p.append(f"{_CFG}: r must be an integer, got {r!r}")
    elif r <= 0:
        p.append(f"{_CFG}: r must be positive, got {r}")
    elif r > base.max_lora_rank:
        p.append(f"{_CFG}: r={r} exceeds max_lora_rank {base.max_lora_rank} of base model {base.name!r}")
    else:
        out.rank = r

    alpha = cfg.get("lora_alpha")
    if "lora_alpha" not in cfg:
        p.append(f"{_CFG}: lora_alpha is missing")
    elif not isinstance(alpha, int | float) or isinstance(alpha, bool) or not math.isfinite(alpha):
        p.append(f"{_CFG}: lora_alpha must be a number, got {alpha!r}")
    else:
        out.alpha = float(alpha)

    out.modules = _check_target_modules(cfg, base, p)

    if cfg.get("use_dora") not in (None, False):
        p.append(f"{_CFG}: use_dora={cfg.get('use_dora')!r} is not supported (DoRA cannot be served)")
    mts = cfg.get("modules_to_save")
    if mts not in (None, [], {}):
        p.append(f"{_CFG}: modules_to_save={mts!r} is not supported (must be empty or null)")
    bias = cfg.get("bias")
    if bias not in (None, "none"):
        p.append(f"{_CFG}: bias={bias!r} is not supported (must be 'none')")

    bmp = cfg.get("base_model_name_or_path")
    if bmp not in (None, "") and bmp not in (base.hf_id, base.name):
        p.append(
            f"{_CFG}: base-model mismatch: base_model_name_or_path {bmp!r} is neither "
            f"{base.hf_id!r} nor {base.name!r}"
        )
    return out


def _check_target_modules(cfg: dict[str, Any], base: BaseModelSpec, p: list[str]) -> list[str] | None:
    tm = cfg.get("target_modules")
    if "target_modules" not in cfg or tm is None:
        p.append(f"{_CFG}: target_modules is missing")
        return None
    if isinstance(tm, str):
        p.append(f"{_CFG}: target_modules must be a JSON list of module names, got the string {tm!r}")
        return None
    if not isinstance(tm, list) or not all(isinstance(m, str) for m in tm):
        p.append(f"{_CFG}: target_modules must be a JSON list of strings, got {tm!r}")
        return None
    if not tm:
        p.append(f"{_CFG}: target_modules is empty")
        return None
    unknown = [m for m in tm if m not in base.target_modules]
    if unknown:
        p.append(
            f"{_CFG}: target_modules {unknown} not supported by base model {base.name!r} "
            f"(allowed: {list(base.target_modules)})"
        )
        return None
    return list(dict.fromkeys(tm))


# --------------------------------------------------------------------------- weights


def _split_lora_name(name: str) -> tuple[str, str, str] | None:
    """``…<module>.lora_A.weight`` → (prefix up to module, module, "A"|"B"); else None."""
    for ab in ("A", "B"):
        suffix = f".lora_{ab}.weight"
        if name.endswith(suffix):
            stem = name[: -len(suffix)]
            module = stem.rsplit(".", 1)[-1]
            if module:
                return stem, module, ab
    return None


def _check_weights(w: SafetensorsInfo | None, cfg: _Config, base: BaseModelSpec, p: list[str]) -> None:
    if w is None:
        p.append(f"missing required file {_W}")
        return
    p.extend(w.problems)
    if not w.header_ok:
        return
    if not w.tensors:
        p.append(f"{_W}: holds no tensors")
        return
    allowed_modules = cfg.modules if cfg.modules is not None else list(base.target_modules)
    shapes = base.module_shapes or {}
    seen: dict[str, dict[str, TensorInfo]] = {}
    for name, t in w.tensors.items():
        where = f"{_W}: tensor {name!r}"
        if t.dtype not in ALLOWED_DTYPES:
            p.append(f"{where}: dtype {t.dtype} is not allowed (use one of {', '.join(ALLOWED_DTYPES)})")
        parts = _split_lora_name(name)
        if parts is None:
            p.append(
                f"{where} is not a lora_A/lora_B weight (name must end in .lora_A.weight or .lora_B.weight)"
            )
            continue
        stem, module, ab = parts
        if module not in allowed_modules:
            p.append(f"{where}: module {module!r} is not in target_modules {allowed_modules}")
        seen.setdefault(stem, {})[ab] = t
        if len(t.shape) != 2:
            p.append(f"{where}: lora_{ab} must be 2-D, has shape {list(t.shape)}")
            continue
        if ab == "A":
            t_rank, dim, dim_name, dim_idx = t.shape[0], t.shape[1], "in", 0
            form = "[r, in]"
        else:
            dim, t_rank, dim_name, dim_idx = t.shape[0], t.shape[1], "out", 1
            form = "[out, r]"
        if cfg.rank is not None and t_rank != cfg.rank:
            p.append(f"{where}: lora_{ab} shape {list(t.shape)} is not {form} with r={cfg.rank} from {_CFG}")
        expected = shapes.get(module)
        if expected is not None and len(expected) == 2 and dim != expected[dim_idx]:
            p.append(
                f"{where}: lora_{ab} shape {list(t.shape)} has {dim_name}={dim} but base model "
                f"{base.name!r} declares {module} {dim_name}={expected[dim_idx]} (module_shapes {expected})"
            )
    for stem, pair in seen.items():
        for ab, other in (("A", "B"), ("B", "A")):
            if ab in pair and other not in pair:
                p.append(f"{_W}: {stem}.lora_{ab}.weight has no matching {stem}.lora_{other}.weight")
        a, b = pair.get("A"), pair.get("B")
        if (
            cfg.rank is None
            and a is not None
            and b is not None
            and len(a.shape) == 2
            and len(b.shape) == 2
            and a.shape[0] != b.shape[1]
        ):
            p.append(f"{_W}: {stem}: lora_A rank {a.shape[0]} differs from lora_B rank {b.shape[1]}")
