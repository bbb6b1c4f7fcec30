"""`loraplane adapters example DIR --base BASE` (the README tour's stand-in for a trained adapter):
a valid PEFT LoRA directory shaped by the base model's record, that the registry's own
validation accepts; an existing non-empty directory is refused."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

import registry.cli._common as common
from registry.admin_client import AdminClient
from registry.demo import demo_base_model
from registry.safetensors_header import parse_bytes
from registry.validation import BaseModelSpec, validate_adapter
from tests.cli.cli_helpers import run_cli


@pytest.fixture
def api(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    def handler(request: httpx.Request) -> httpx.Response:
        assert request.url.path == "/admin/v1/base-models/demo-base"
        return httpx.Response(200, json={**demo_base_model(), "revision": None, "approvals_required": 0})

    def _client(url: str, token: str | None = None, **kw: Any) -> AdminClient:
        return AdminClient(url, token, transport=httpx.MockTransport(handler))

    monkeypatch.setattr(common, "AdminClient", _client)
    yield


def test_example_adapter_is_valid_for_its_base_model(api: None, tmp_path: Path) -> None:
    out = tmp_path / "support-v2"
    res = run_cli(["adapters", "example", str(out), "--base", "demo-base", "--token", "t"])
    assert res.exit_code == 0, res.output
    assert f"push it with loraplane adapters push {out} --adapter ID" in res.stdout
    config = json.loads((out / "adapter_config.json").read_text())
    assert config["target_modules"] == ["q_proj", "v_proj"] and config["r"] == 8
    assert config["base_model_name_or_path"] == "loraplane/demo-base"
    bm = demo_base_model()
    spec = BaseModelSpec(
        bm["name"], bm["hf_id"], bm["max_lora_rank"], bm["target_modules"], bm["module_shapes"]
    )
    weights = parse_bytes((out / "adapter_model.safetensors").read_bytes())
    checked = validate_adapter((out / "adapter_config.json").read_bytes(), weights, spec)  # raises if not
    assert checked.rank == 8 and checked.target_modules == ["q_proj", "v_proj"]
    again = run_cli(["adapters", "example", str(out), "--base", "demo-base", "--token", "t"])
    assert again.exit_code == 1 and "is not an empty directory" in again.stderr
    big = run_cli(
        ["adapters", "example", str(tmp_path / "x"), "--base", "demo-base", "--rank", "128", "--token", "t"]
    )
    assert big.exit_code == 1 and "above demo-base's max_lora_rank 64" in big.stderr
