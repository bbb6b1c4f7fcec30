"""`loraplane base-models add --config PATH|HF_ID` (issue 25.9): module shapes, target modules and
hub id read from the model's config.json — a local file or directory, or a hub model fetched with
huggingface_hub (the local fake Hub of the import tests) only when LORAPLANE_ALLOWED_SOURCES
allows it; and the help text that shows `[in, out]` whole."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

import registry.cli._common as common
from registry.admin_client import AdminClient
from tests.cli.cli_helpers import run_cli
from tests.registry.hubfake import FakeHub

# a small Llama-style decoder with grouped KV heads (8 heads, 2 KV heads, head_dim 32)
CONFIG = {
    "_name_or_path": "my-org/llama-mini",
    "architectures": ["LlamaForCausalLM"],
    "hidden_size": 256,
    "intermediate_size": 688,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
}
SHAPES = {
    "q_proj": [256, 256],
    "k_proj": [256, 64],
    "v_proj": [256, 64],
    "o_proj": [256, 256],
    "gate_proj": [256, 688],
    "up_proj": [256, 688],
    "down_proj": [688, 256],
}


class Recorder:
    def __init__(self) -> None:
        self.posted: list[dict[str, Any]] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.read())
        self.posted.append(body)
        return httpx.Response(201, json={**body, "revision": None, "approvals_required": 0})


@pytest.fixture
def api(monkeypatch: pytest.MonkeyPatch) -> Iterator[Recorder]:
    rec = Recorder()

    def _client(url: str, token: str | None = None, **kw: Any) -> AdminClient:
        return AdminClient(url, token, transport=httpx.MockTransport(rec))

    monkeypatch.setattr(common, "AdminClient", _client)
    yield rec


@pytest.fixture
def hub() -> Iterator[FakeHub]:
    h = FakeHub()
    yield h
    h.stop()


def test_add_from_a_local_config(api: Recorder, tmp_path: Path) -> None:
    model = tmp_path / "llama-mini"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(CONFIG))
    for source in (model, model / "config.json"):
        res = run_cli(
            ["base-models", "add", "mini", "--config", str(source), "--max-lora-rank", "16", "--token", "t"]
        )
        assert res.exit_code == 0, res.output
        assert api.posted[-1] == {
            "name": "mini",
            "hf_id": "my-org/llama-mini",  # the config's _name_or_path
            "max_lora_rank": 16,
            "target_modules": list(SHAPES),
            "module_shapes": SHAPES,
        }
    res = run_cli(
        ["base-models", "add", "mini", "--config", str(model), "--max-lora-rank", "16", "--token", "t",
         "--target-modules", "q_proj,v_proj", "--hf-id", "org/other"]
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    assert (api.posted[-1]["target_modules"], api.posted[-1]["hf_id"]) == (["q_proj", "v_proj"], "org/other")
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "config.json").write_text(json.dumps({"hidden_size": 256}))
    res = run_cli(["base-models", "add", "x", "--config", str(bad), "--max-lora-rank", "8", "--token", "t"])
    assert res.exit_code == 2 and "intermediate_size must be a positive integer" in res.output
    both = ["--config", str(model), "--module-shapes", "{}"]
    res = run_cli(["base-models", "add", "x", *both, "--max-lora-rank", "8", "--token", "t"])
    assert res.exit_code == 2 and "not both" in res.output
    res = run_cli(["base-models", "add", "x", "--max-lora-rank", "8", "--token", "t"])
    assert res.exit_code == 2 and "--config PATH|HF_ID" in res.output
    assert len(api.posted) == 3  # none of the refusals reached the API


def test_add_from_a_hub_model_within_the_allow_list(api: Recorder, hub: FakeHub, tmp_path: Path) -> None:
    hub.commit("my-org/llama-mini", {"config.json": json.dumps(CONFIG).encode(), "README.md": b"hi"})
    env = {"HF_ENDPOINT": hub.url, "HF_HOME": str(tmp_path / "hf"), "LORAPLANE_HF_ENDPOINT": ""}
    args = [
        "base-models",
        "add",
        "mini",
        "--config",
        "my-org/llama-mini",
        "--max-lora-rank",
        "16",
        "--token",
        "t",
    ]
    res = run_cli(args, env=env)  # no allow-list: nothing fetched
    assert res.exit_code == 2 and "LORAPLANE_ALLOWED_SOURCES" in res.output
    assert hub.requests == [] and api.posted == []
    res = run_cli(args, env={**env, "LORAPLANE_ALLOWED_SOURCES": json.dumps(["hf://other-org/*"])})
    assert res.exit_code == 2 and "is not allowed by LORAPLANE_ALLOWED_SOURCES" in res.output
    assert "hf://my-org/*" in res.output  # the pattern that would allow it
    assert hub.requests == []
    res = run_cli(args, env={**env, "LORAPLANE_ALLOWED_SOURCES": json.dumps(["hf://my-org/*"])})
    assert res.exit_code == 0, res.output
    assert api.posted[-1]["hf_id"] == "my-org/llama-mini" and api.posted[-1]["module_shapes"] == SHAPES
    assert [r.path for r in hub.file_requests()][-1].endswith("/my-org/llama-mini/resolve/main/config.json")
    missing = ["base-models", "add", "x", "--config", "my-org/nope", "--max-lora-rank", "8", "--token", "t"]
    res = run_cli(missing, env={**env, "LORAPLANE_ALLOWED_SOURCES": json.dumps(["hf://my-org/*"])})
    assert res.exit_code == 2 and "cannot fetch config.json of hf://my-org/nope@main" in res.output


def test_help_shows_in_out_whole() -> None:
    res = run_cli(["base-models", "add", "--help"])
    assert res.exit_code == 0
    flat = " ".join(res.stdout.replace("│", " ").split())
    assert '{"q_proj": [in, out], …}' in flat  # rich markup used to swallow "[in, out]"
    assert "--config" in flat


def test_no_help_text_loses_characters_to_rich_markup() -> None:
    """Typer renders help through rich: `[in, out]` or `[env X]` read as markup vanished."""
    import typer.main
    from rich.markup import render

    from loraplane.cli import app

    def walk(cmd: Any, path: str) -> Iterator[tuple[str, str]]:
        for p in cmd.params:
            if getattr(p, "help", None):
                yield f"{path} {p.name}", p.help
        if cmd.help:
            yield path, cmd.help
        for name, sub in getattr(cmd, "commands", {}).items():
            yield from walk(sub, f"{path} {name}")

    lost = []
    for where, text in walk(typer.main.get_command(app), "loraplane"):
        plain = render(text).plain
        if plain != text and "\\[" not in text:  # changed by markup, and not escaped on purpose
            lost.append((where, text, plain))
    assert lost == []
