"""``loraplane simulate`` flag handling (no server is started)."""

from __future__ import annotations

import pytest
import typer
from typer.testing import CliRunner

from loraplane.cli import app
from simulator.cli import parse_lora_modules, runtime_lora_from_env


def test_lora_modules_item_forms() -> None:
    assert parse_lora_modules(["a=/x/a", "b=/x/b c=/x/c"]) == [("a", "/x/a"), ("b", "/x/b"), ("c", "/x/c")]
    assert parse_lora_modules(['{"name": "j", "path": "/x/j", "base_model_name": "m"}']) == [("j", "/x/j")]
    with pytest.raises(typer.BadParameter):
        parse_lora_modules(["a=/x,b"])
    with pytest.raises(typer.BadParameter):
        parse_lora_modules(["nothing"])


@pytest.mark.parametrize(
    ("value", "expected"),
    [(None, True), ("1", True), ("True", True), (" true ", True), ("0", False), ("no", False)],
)
def test_runtime_lora_env_like_vllm(
    monkeypatch: pytest.MonkeyPatch, value: str | None, expected: bool
) -> None:
    if value is None:
        monkeypatch.delenv("VLLM_ALLOW_RUNTIME_LORA_UPDATING", raising=False)
    else:
        monkeypatch.setenv("VLLM_ALLOW_RUNTIME_LORA_UPDATING", value)
    assert runtime_lora_from_env() is expected


def test_simulate_is_registered_and_validates_flags() -> None:
    runner = CliRunner()
    r = runner.invoke(app, ["simulate", "--help"])
    assert r.exit_code == 0 and "--max-loras" in r.output and "--zero-latency" in r.output
    r = runner.invoke(app, ["simulate", "--max-lora-rank", "48"])
    assert r.exit_code == 2, r.output
    r = runner.invoke(app, ["simulate", "--max-loras", "4", "--max-cpu-loras", "2"])
    assert r.exit_code == 2, r.output
    r = runner.invoke(app, ["simulate", "--fail-load-status", "418"])
    assert r.exit_code == 2, r.output
