"""``loraplane base-models …``: register and inspect the base models adapters are built on."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

from registry.cli._common import CliOptions, admin_command, client, emit, field, new_group

base_models_app = new_group("Base models that adapters are built on.")


def parse_module_shapes(raw: str | None) -> dict[str, list[int]] | None:
    """``--module-shapes '{"q_proj": [4096, 4096]}'`` or ``@shapes.json``."""
    if raw is None:
        return None
    text = raw
    if raw.startswith("@"):
        path = Path(raw[1:])
        try:
            text = path.read_text()
        except OSError as exc:
            raise typer.BadParameter(
                f"cannot read {path}: {exc.strerror}", param_hint="--module-shapes"
            ) from None
    try:
        data: Any = json.loads(text)
    except ValueError as exc:
        raise typer.BadParameter(f"not valid JSON: {exc}", param_hint="--module-shapes") from None
    ok = isinstance(data, dict) and all(
        isinstance(k, str)
        and isinstance(v, list)
        and len(v) == 2
        and all(isinstance(n, int) and not isinstance(n, bool) and n > 0 for n in v)
        for k, v in data.items()
    )
    if not ok:
        raise typer.BadParameter(
            'expected an object of module → [in, out], e.g. {"q_proj": [4096, 4096]}',
            param_hint="--module-shapes",
        )
    return data  # type: ignore[no-any-return]


@admin_command(base_models_app, "add")
def add(
    opts: CliOptions,
    name: Annotated[str, typer.Argument(help="Base model name (slug), as clients will send it.")],
    hf_id: Annotated[
        str, typer.Option("--hf-id", help="Hugging Face id, e.g. meta-llama/Llama-3.1-8B-Instruct.")
    ],
    max_lora_rank: Annotated[
        int, typer.Option("--max-lora-rank", min=1, help="Largest adapter rank served.")
    ],
    target_modules: Annotated[
        str, typer.Option("--target-modules", help="Comma-separated, e.g. q_proj,k_proj,v_proj,o_proj.")
    ],
    module_shapes: Annotated[
        str | None, typer.Option("--module-shapes", help='JSON {"q_proj": [in, out], …} or @file.json.')
    ] = None,
    revision: Annotated[str | None, typer.Option("--revision", help="Model revision.")] = None,
) -> None:
    """Register a base model."""
    modules = [m.strip() for m in target_modules.split(",") if m.strip()]
    if not modules:
        raise typer.BadParameter("give at least one module", param_hint="--target-modules")
    shapes = parse_module_shapes(module_shapes)
    with client(opts) as admin:
        result = admin.create_base_model(
            name, hf_id, max_lora_rank, modules, module_shapes=shapes, revision=revision
        )
    emit(opts, result, summary=f"registered base model {name}")


@admin_command(base_models_app, "list")
def list_base_models(opts: CliOptions) -> None:
    """List base models."""
    with client(opts) as admin:
        rows = admin.list_base_models()
    emit(
        opts,
        rows,
        columns=[
            ("name", field("name")),
            ("hf id", field("hf_id")),
            ("max rank", field("max_lora_rank")),
            ("target modules", field("target_modules")),
            ("revision", field("revision")),
        ],
        title="Base models",
    )


@admin_command(base_models_app, "update")
def update(
    opts: CliOptions,
    name: Annotated[str, typer.Argument(help="Base model name.")],
    approvals_required: Annotated[
        int,
        typer.Option(
            "--approvals-required", min=0, help="Approvals a promotion of its adapters needs (0: none)."
        ),
    ],
) -> None:
    """Change a base model's approvals_required (the default of its adapters; admin only)."""
    with client(opts) as admin:
        result = admin.update_base_model(name, approvals_required=approvals_required)
    emit(opts, result, summary=f"{name}: promotions of its adapters need {approvals_required} approval(s)")


@admin_command(base_models_app, "show")
def show(opts: CliOptions, name: Annotated[str, typer.Argument(help="Base model name.")]) -> None:
    """Describe a base model."""
    with client(opts) as admin:
        result = admin.get_base_model(name)
    emit(opts, result, title=f"base model {name}")
