"""Every adapter validation rule (SPEC §3, §13) with a crafted bad adapter."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import pytest

from kit.errors import InvalidAdapter
from registry.adapter_factory import tensor_name, write_adapter
from registry.demo import demo_base_model
from registry.safetensors_header import SafetensorsHeaderParser, parse_bytes
from registry.validation import (
    BaseModelSpec,
    ValidatedAdapter,
    cap_problems,
    check_filename,
    validate_adapter,
)

W = "adapter_model.safetensors"
C = "adapter_config.json"


def demo_base(**over: Any) -> BaseModelSpec:
    b = demo_base_model()
    b.pop("revision", None)
    b.update(over)
    return BaseModelSpec(
        name=b["name"],
        hf_id=b["hf_id"],
        max_lora_rank=b["max_lora_rank"],
        target_modules=b["target_modules"],
        module_shapes=b.get("module_shapes"),
    )


def load(d: Path) -> tuple[bytes, Any]:
    return (d / C).read_bytes(), parse_bytes((d / W).read_bytes())


def problems_of(config: bytes | None, weights: Any, base: BaseModelSpec | None = None) -> list[str]:
    with pytest.raises(InvalidAdapter) as ei:
        validate_adapter(config, weights, base or demo_base())
    assert ei.value.status == 422 and ei.value.code == "invalid_adapter"
    assert ei.value.details == {"problems": ei.value.problems}
    return ei.value.problems


def has(problems: list[str], *fragments: str) -> None:
    for frag in fragments:
        assert any(frag in p for p in problems), f"{frag!r} not in {problems}"


def st_bytes(header: dict[str, Any], data: bytes, *, length: int | None = None) -> bytes:
    hb = json.dumps(header).encode()
    return struct.pack("<Q", len(hb) if length is None else length) + hb + data


def a_entry(module: str = "q_proj", ab: str = "A", layer: int = 0) -> str:
    return tensor_name(layer, module, ab)


def cfg_bytes(**over: Any) -> bytes:
    cfg: dict[str, Any] = {
        "peft_type": "LORA",
        "r": 2,
        "lora_alpha": 4,
        "target_modules": ["q_proj"],
        "bias": "none",
        "base_model_name_or_path": "loraplane/demo-base",
    }
    cfg.update(over)
    return json.dumps(cfg).encode()


def pair_header(rank: int = 2, din: int = 256, dout: int = 256, dtype: str = "F16") -> tuple[dict, bytes]:
    a = rank * din * 2
    b = dout * rank * 2
    h = {
        a_entry("q_proj", "A"): {"dtype": dtype, "shape": [rank, din], "data_offsets": [0, a]},
        a_entry("q_proj", "B"): {"dtype": dtype, "shape": [dout, rank], "data_offsets": [a, a + b]},
    }
    return h, b"\0" * (a + b)


# --------------------------------------------------------------------------- happy path


def test_valid_adapter_passes(tmp_path: Path) -> None:
    d = write_adapter(tmp_path / "a", rank=8, alpha=16, target_modules=["q_proj", "down_proj"])
    res = validate_adapter(*load(d), demo_base())
    assert res == ValidatedAdapter(rank=8, lora_alpha=16.0, target_modules=["q_proj", "down_proj"])


@pytest.mark.parametrize("dtype", ["F16", "BF16", "F32"])
def test_allowed_dtypes(tmp_path: Path, dtype: str) -> None:
    d = write_adapter(tmp_path / "a", dtype=dtype)
    assert validate_adapter(*load(d), demo_base()).rank == 8


def test_base_model_by_name_and_unset_are_accepted(tmp_path: Path) -> None:
    d = write_adapter(tmp_path / "a", base_model_name_or_path="demo-base")
    assert validate_adapter(*load(d), demo_base()).rank == 8
    d2 = write_adapter(tmp_path / "b", base_model_name_or_path=None)
    assert validate_adapter(*load(d2), demo_base()).rank == 8


def test_streaming_parser_matches_whole_file_in_tiny_chunks(tmp_path: Path) -> None:
    raw = (write_adapter(tmp_path / "a") / W).read_bytes()
    p = SafetensorsHeaderParser()
    for i in range(0, len(raw), 3):
        p.feed(raw[i : i + 3])
    info = p.finish()
    assert info.problems == []
    assert info.total_size == len(raw)
    assert info.tensors == parse_bytes(raw).tensors
    assert len(info.tensors) == 8


# --------------------------------------------------------------------------- config rules


@pytest.mark.parametrize(
    ("over", "fragment"),
    [
        ({"peft_type": "IA3"}, "peft_type must be 'LORA', got 'IA3'"),
        ({"r": 0}, "r must be positive, got 0"),
        ({"r": -3}, "r must be positive, got -3"),
        ({"r": 8.0}, "r must be an integer, got 8.0"),
        ({"r": True}, "r must be an integer, got True"),
        ({"r": "8"}, "r must be an integer, got '8'"),
        ({"r": 128}, "r=128 exceeds max_lora_rank 64"),
        ({"lora_alpha": "16"}, "lora_alpha must be a number, got '16'"),
        ({"lora_alpha": None}, "lora_alpha must be a number, got None"),
        ({"target_modules": "all-linear"}, "got the string 'all-linear'"),
        ({"target_modules": []}, "target_modules is empty"),
        ({"target_modules": ["q_proj", 3]}, "target_modules must be a JSON list of strings"),
        ({"target_modules": ["q_proj", "lm_head"]}, "target_modules ['lm_head'] not supported by base model"),
        ({"use_dora": True}, "use_dora=True is not supported"),
        ({"modules_to_save": ["lm_head"]}, "modules_to_save=['lm_head'] is not supported"),
        ({"bias": "all"}, "bias='all' is not supported"),
        ({"bias": "lora_only"}, "bias='lora_only' is not supported"),
        ({"base_model_name_or_path": "meta-llama/Llama-3-8B"}, "base-model mismatch"),
    ],
)
def test_config_rule(over: dict[str, Any], fragment: str) -> None:
    h, data = pair_header()
    problems = problems_of(cfg_bytes(**over), parse_bytes(st_bytes(h, data)))
    has(problems, f"{C}: ")
    has(problems, fragment)


def test_missing_config_fields() -> None:
    h, data = pair_header()
    raw = json.dumps({"peft_type": "LORA"}).encode()
    has(
        problems_of(raw, parse_bytes(st_bytes(h, data))),
        "r is missing",
        "lora_alpha is missing",
        "target_modules is missing",
    )


@pytest.mark.parametrize(
    "bad", [b"{not json", b"[1, 2]", b"\xff\xfe", b'{"r": NaN}', b'{"lora_alpha": Infinity}']
)
def test_config_not_json_or_nan(bad: bytes) -> None:
    h, data = pair_header()
    problems = problems_of(bad, parse_bytes(st_bytes(h, data)))
    assert any(p.startswith(f"{C}: ") for p in problems)
    if b"NaN" in bad or b"Infinity" in bad:
        has(problems, "is not allowed in JSON")


def test_missing_required_files() -> None:
    problems = problems_of(None, None)
    assert f"missing required file {C}" in problems
    assert f"missing required file {W}" in problems


def test_several_config_problems_reported_together(tmp_path: Path) -> None:
    d = write_adapter(
        tmp_path / "a",
        config_overrides={"use_dora": True, "bias": "all", "peft_type": "PROMPT", "modules_to_save": ["x"]},
    )
    problems = problems_of(*load(d))
    has(problems, "use_dora", "bias='all'", "peft_type", "modules_to_save")
    assert len(problems) == 4


# --------------------------------------------------------------------------- header corruption


def test_header_length_beyond_file() -> None:
    info = parse_bytes(struct.pack("<Q", 10_000) + b"{}")
    assert info.problems == [f"{W}: header length 10000 runs past the end of the file (10 bytes)"]
    has(problems_of(cfg_bytes(), info), "runs past the end of the file")


def test_file_shorter_than_length_prefix() -> None:
    has(problems_of(cfg_bytes(), parse_bytes(b"\x01\x02")), "header is missing")


def test_header_length_over_cap() -> None:
    p = SafetensorsHeaderParser(max_header_bytes=1000)
    p.feed(struct.pack("<Q", 5000) + b"{" * 5000)
    info = p.finish()
    has(info.problems, "larger than the limit of 1000 bytes")


@pytest.mark.parametrize(("raw", "frag"), [(b"{nope", "not valid JSON"), (b"[1]", "not a JSON object")])
def test_header_not_json(raw: bytes, frag: str) -> None:
    has(problems_of(cfg_bytes(), parse_bytes(struct.pack("<Q", len(raw)) + raw)), f"{W}: header is {frag}")


def test_duplicate_tensor_names_in_header() -> None:
    raw = b'{"x.q_proj.lora_A.weight": {}, "x.q_proj.lora_A.weight": {}}'
    has(problems_of(cfg_bytes(), parse_bytes(struct.pack("<Q", len(raw)) + raw)), "duplicate key")


def test_offsets_outside_data_area() -> None:
    h, data = pair_header()
    name_b = a_entry("q_proj", "B")
    start = h[name_b]["data_offsets"][0]
    h[name_b]["data_offsets"] = [start + 4096, start + 4096 + 1024]
    problems = problems_of(cfg_bytes(), parse_bytes(st_bytes(h, data)))
    has(problems, "lie outside the data area", "hole of 4096 bytes")


def test_overlapping_tensors() -> None:
    h, data = pair_header()
    name_b = a_entry("q_proj", "B")
    h[name_b]["data_offsets"] = [100, 100 + 1024]
    problems = problems_of(cfg_bytes(), parse_bytes(st_bytes(h, data)))
    has(problems, "overlap")


def test_truncated_file() -> None:
    h, data = pair_header()
    problems = problems_of(cfg_bytes(), parse_bytes(st_bytes(h, data[:-100])))
    has(problems, "file is truncated: data area has", "lie outside the data area")


def test_trailing_garbage() -> None:
    h, data = pair_header()
    has(problems_of(cfg_bytes(), parse_bytes(st_bytes(h, data + b"xx"))), "2 trailing bytes")


def test_wrong_byte_count_for_shape() -> None:
    h, data = pair_header()
    name_a = a_entry("q_proj", "A")
    h[name_a]["shape"] = [2, 128]
    problems = problems_of(cfg_bytes(), parse_bytes(st_bytes(h, data)))
    has(problems, "holds 1024 bytes but shape [2, 128] of F16 needs 512 bytes")


def test_bad_dtype_and_unknown_dtype() -> None:
    h, data = pair_header()
    h[a_entry("q_proj", "A")]["dtype"] = "I16"
    h[a_entry("q_proj", "B")]["dtype"] = "Q4"
    problems = problems_of(cfg_bytes(), parse_bytes(st_bytes(h, data)))
    has(problems, "dtype I16 is not allowed (use one of F16, BF16, F32)", "unknown dtype 'Q4'")


def test_f64_not_allowed(tmp_path: Path) -> None:
    h, _ = pair_header()
    for e in h.values():
        e["dtype"] = "F64"
    a = 2 * 256 * 8
    h[a_entry("q_proj", "A")]["data_offsets"] = [0, a]
    h[a_entry("q_proj", "B")]["data_offsets"] = [a, 2 * a]
    has(problems_of(cfg_bytes(), parse_bytes(st_bytes(h, b"\0" * 2 * a))), "dtype F64 is not allowed")


# --------------------------------------------------------------------------- tensor rules


def test_zero_tensors() -> None:
    info = parse_bytes(st_bytes({"__metadata__": {"format": "pt"}}, b""))
    assert info.problems == []
    assert problems_of(cfg_bytes(), info) == [f"{W}: holds no tensors"]


def test_missing_lora_b_partner_and_missing_a_partner() -> None:
    h, data = pair_header()
    a = 2 * 256 * 2
    only_a = {a_entry("q_proj", "A"): h[a_entry("q_proj", "A")]}
    has(problems_of(cfg_bytes(), parse_bytes(st_bytes(only_a, data[:a]))), "lora_A.weight has no matching")
    only_b = {a_entry("q_proj", "B"): dict(h[a_entry("q_proj", "B")], data_offsets=[0, a])}
    has(problems_of(cfg_bytes(), parse_bytes(st_bytes(only_b, data[:a]))), "lora_B.weight has no matching")


def test_unknown_module_and_non_lora_tensor() -> None:
    h, data = pair_header()
    extra = {
        "base_model.model.model.layers.0.mlp.up_proj.lora_A.weight": {
            "dtype": "F16",
            "shape": [2, 256],
            "data_offsets": [len(data), len(data) + 1024],
        },
        "base_model.model.lm_head.weight": {
            "dtype": "F16",
            "shape": [2],
            "data_offsets": [len(data) + 1024, len(data) + 1028],
        },
    }
    problems = problems_of(cfg_bytes(), parse_bytes(st_bytes({**h, **extra}, data + b"\0" * 1028)))
    has(
        problems,
        "module 'up_proj' is not in target_modules ['q_proj']",
        "'base_model.model.lm_head.weight' is not a lora_A/lora_B weight",
    )


def test_shapes_vs_module_shapes() -> None:
    h, data = pair_header(din=128, dout=512)
    problems = problems_of(cfg_bytes(), parse_bytes(st_bytes(h, data)))
    has(
        problems,
        "lora_A shape [2, 128] has in=128 but base model 'demo-base' declares q_proj in=256",
        "lora_B shape [512, 2] has out=512 but base model 'demo-base' declares q_proj out=256",
    )
    # without module_shapes on the base, only the rank is checked
    assert (
        validate_adapter(cfg_bytes(), parse_bytes(st_bytes(h, data)), demo_base(module_shapes=None)).rank == 2
    )


def test_rank_mismatch_between_config_and_tensors(tmp_path: Path) -> None:
    d = write_adapter(tmp_path / "a", rank=8, config_overrides={"r": 16})
    problems = problems_of(*load(d))
    has(
        problems,
        "lora_A shape [8, 256] is not [r, in] with r=16",
        "lora_B shape [256, 8] is not [out, r] with r=16",
    )


def test_non_2d_tensor() -> None:
    h = {a_entry("q_proj", "A"): {"dtype": "F16", "shape": [2, 256, 1], "data_offsets": [0, 1024]}}
    has(problems_of(cfg_bytes(), parse_bytes(st_bytes(h, b"\0" * 1024))), "must be 2-D")


def test_config_and_weight_problems_reported_together() -> None:
    h, data = pair_header(dtype="F16")
    h[a_entry("q_proj", "A")]["dtype"] = "U16"
    problems = problems_of(
        cfg_bytes(use_dora=True, r=3, base_model_name_or_path="other"), parse_bytes(st_bytes(h, data))
    )
    has(problems, "use_dora", "base-model mismatch", "dtype U16 is not allowed", "with r=3")
    assert len(problems) >= 5


def test_problem_list_is_capped() -> None:
    long = [f"p{i}" for i in range(500)]
    capped = cap_problems(long)
    assert len(capped) == 201 and capped[-1] == "… and 300 more problems"
    assert cap_problems(["a"]) == ["a"]


# --------------------------------------------------------------------------- filenames


@pytest.mark.parametrize("ok", ["adapter_config.json", "adapter_model.safetensors", "README.md", "a-b_c.1"])
def test_good_filenames(ok: str) -> None:
    assert check_filename(ok) is None


@pytest.mark.parametrize(
    ("bad", "frag"),
    [
        ("../etc/passwd", "contains '..'"),
        ("a..b", "contains '..'"),
        ("dir/adapter_config.json", "is a path"),
        ("C:\\x\\y", "is a path"),
        (".hidden", "not allowed"),
        ("-rf", "not allowed"),
        ("spa ce", "not allowed"),
        ("", "empty"),
        ("x" * 300, "longer than"),
    ],
)
def test_bad_filenames(bad: str, frag: str) -> None:
    problem = check_filename(bad)
    assert problem is not None and frag in problem
