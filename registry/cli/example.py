"""``loraplane adapters example DIR --base BASE``: write a small valid PEFT LoRA adapter (random
weights) for a registered base model, to try pushes, canaries and rollbacks before an adapter of
your own is trained. Its shapes and ``base_model_name_or_path`` come from the base model's record
in the registry (``GET /base-models/{name}``), so it passes validation and loads on the replicas
(on a real model it changes the answers at random: it is an example, not a model). Registered on
the ``adapters`` group."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from registry.cli._common import CliOptions, admin_command, client, fail, print_json
from registry.cli.adapters import adapters_app

DEFAULT_MODULES = ("q_proj", "v_proj")


@admin_command(adapters_app, "example")
def example(
    opts: CliOptions,
    directory: Annotated[
        Path, typer.Argument(help="Directory to write (created; must be empty if it exists).")
    ],
    base: Annotated[str, typer.Option("--base", help="The registered base model it is for.")],
    rank: Annotated[int, typer.Option("--rank", min=1, max=256, help="LoRA rank r.")] = 8,
    seed: Annotated[
        int, typer.Option("--seed", help="Seed of the random weights (same seed, same files).")
    ] = 0,
) -> None:
    """Write a small example LoRA adapter (random weights) for a base model, ready to push."""
    from registry.adapter_factory import write_adapter

    if directory.exists() and (not directory.is_dir() or any(directory.iterdir())):
        raise fail(f"{directory} exists and is not an empty directory")
    with client(opts) as admin:
        spec = admin.get_base_model(base)
    shapes = spec.get("module_shapes") or {}
    modules = [m for m in DEFAULT_MODULES if m in spec.get("target_modules", []) and m in shapes]
    modules = modules or [m for m in spec.get("target_modules", []) if m in shapes][:2]
    if not modules:
        raise fail(
            f"base model {base!r} has no module_shapes for its target modules: cannot shape an example"
        )
    if rank > int(spec.get("max_lora_rank") or rank):
        raise fail(f"--rank {rank} is above {base}'s max_lora_rank {spec['max_lora_rank']}")
    write_adapter(
        directory, rank=rank, alpha=2 * rank, target_modules=modules, module_shapes=shapes, seed=seed,
        base_model_name_or_path=spec.get("hf_id"),
    )  # fmt: skip
    files = sorted(p.name for p in directory.iterdir())
    if opts.as_json:
        print_json({"directory": str(directory), "base_model": base, "rank": rank, "target_modules": modules,
                    "files": files})  # fmt: skip
        return
    typer.echo(
        f"wrote an example adapter for {base} in {directory} (r={rank}, {', '.join(modules)}; "
        f"{', '.join(files)}): push it with loraplane adapters push {directory} --adapter ID"
    )
