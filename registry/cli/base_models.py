"""``loraplane base-models …``: register and inspect the base models adapters are built on.

``add --config PATH|HF_ID`` reads the module shapes (and, unless given, the target modules and the
hub id) from the model's ``config.json`` (:mod:`registry.model_config`, as ``loraplane up --engine
vllm`` does); a hub id is fetched with ``huggingface_hub`` only when ``LORAPLANE_ALLOWED_SOURCES``
has an ``hf://`` pattern that matches it, as for adapter imports."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape

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


SHAPES_HELP = escape('JSON {"q_proj": [in, out], …} or @file.json (--config reads them for you).')
CONFIG_HELP = (
    "The model's config.json, to read module shapes (and the target modules, the hub id) from: a "
    "path (a model directory or its config.json), or a Hugging Face id ORG/MODEL (or hf://ORG/MODEL"
    "@REVISION) fetched with huggingface_hub when LORAPLANE_ALLOWED_SOURCES allows it (e.g. "
    "'[\"hf://meta-llama/*\"]'; LORAPLANE_HF_TOKEN / LORAPLANE_HF_ENDPOINT or HF_ENDPOINT honoured)."
)


def _allowed_sources() -> list[str]:
    raw = os.environ.get("LORAPLANE_ALLOWED_SOURCES", "").strip()
    if not raw:
        return []
    try:
        value = json.loads(raw)
    except ValueError:
        value = None
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise typer.BadParameter(
            "LORAPLANE_ALLOWED_SOURCES must be a JSON list, e.g. '[\"hf://my-org/*\"]'", param_hint="--config"
        )
    return value


def _hub_config_dir(source: str, revision: str | None) -> tuple[Path, str]:
    """Fetch ``config.json`` of a hub model (allow-list first); (its directory, the repo id)."""
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import EntryNotFoundError, HfHubHTTPError, LocalEntryNotFoundError

    from kit.errors import InvalidRequest
    from registry.ingest.hf_uri import HF_SCHEME, check_hf_uri

    uri = source if source.startswith(HF_SCHEME) else HF_SCHEME + source
    if revision and "@" not in uri[len(HF_SCHEME) :]:
        uri = f"{uri}@{revision}"
    try:
        ref = check_hf_uri(uri, _allowed_sources())
    except InvalidRequest as exc:
        hint = f" (e.g. export LORAPLANE_ALLOWED_SOURCES='[\"hf://{source.removeprefix(HF_SCHEME).split('/')[0]}/*\"]')"
        raise typer.BadParameter(exc.message + (hint if exc.code == "source_not_allowed" else ""),
                                 param_hint="--config") from None  # fmt: skip
    token = os.environ.get("LORAPLANE_HF_TOKEN") or None
    endpoint = os.environ.get("LORAPLANE_HF_ENDPOINT") or None
    try:
        path = hf_hub_download(
            ref.repo_id, "config.json", subfolder=ref.subdir or None, revision=ref.revision,
            token=token or False, endpoint=endpoint,
        )  # fmt: skip
    except (EntryNotFoundError, LocalEntryNotFoundError, HfHubHTTPError, OSError) as exc:
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise typer.BadParameter(
            f"cannot fetch config.json of {ref.uri} from the Hugging Face Hub: {reason}",
            param_hint="--config",
        ) from None
    return Path(path).parent, ref.repo_id


def spec_from_config(
    source: str, name: str, max_lora_rank: int, hf_id: str | None, revision: str | None
) -> dict[str, Any]:
    """The base model body from a config.json (:func:`registry.model_config.base_model_spec`)."""
    from registry.model_config import base_model_spec

    local = Path(source).expanduser()
    if local.is_file():
        directory = local.parent
    elif local.is_dir():
        directory = local
    elif source.startswith("hf://") or (source.count("/") == 1 and not source.startswith((".", "/", "~"))):
        directory, repo_id = _hub_config_dir(source, revision)
        hf_id = hf_id or repo_id
    else:
        raise typer.BadParameter(
            f"{source} is neither a file, a directory nor a Hugging Face id ORG/MODEL", param_hint="--config"
        )
    try:
        return base_model_spec(directory, name, max_lora_rank=max_lora_rank, hf_id=hf_id)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--config") from None


@admin_command(base_models_app, "add")
def add(
    opts: CliOptions,
    name: Annotated[str, typer.Argument(help="Base model name (slug), as clients will send it.")],
    max_lora_rank: Annotated[
        int, typer.Option("--max-lora-rank", min=1, help="Largest adapter rank served.")
    ],
    config: Annotated[str | None, typer.Option("--config", help=CONFIG_HELP)] = None,
    hf_id: Annotated[
        str | None,
        typer.Option(
            "--hf-id",
            help="Hugging Face id adapters name as base_model_name_or_path, e.g. "
            "meta-llama/Llama-3.1-8B-Instruct (with --config: that id, or the config's _name_or_path).",
        ),
    ] = None,
    target_modules: Annotated[
        str | None,
        typer.Option(
            "--target-modules",
            help="Comma-separated, e.g. q_proj,k_proj,v_proj,o_proj (with --config: default all seven "
            "attention and MLP projections).",
        ),
    ] = None,
    module_shapes: Annotated[str | None, typer.Option("--module-shapes", help=SHAPES_HELP)] = None,
    revision: Annotated[str | None, typer.Option("--revision", help="Model revision.")] = None,
) -> None:
    """Register a base model: from its config.json (--config PATH|HF_ID), or by hand (--hf-id,
    --target-modules, --module-shapes)."""
    modules = [m.strip() for m in (target_modules or "").split(",") if m.strip()]
    if target_modules is not None and not modules:
        raise typer.BadParameter("give at least one module", param_hint="--target-modules")
    if config is not None:
        if module_shapes is not None:
            raise typer.BadParameter(
                "give --config or --module-shapes, not both", param_hint="--module-shapes"
            )
        spec = spec_from_config(config, name, max_lora_rank, hf_id, revision)
        hf_id, shapes = str(spec["hf_id"]), spec["module_shapes"]
        modules = modules or list(spec["target_modules"])
    else:
        if hf_id is None or not modules:
            raise typer.BadParameter(
                "give --hf-id and --target-modules (and --module-shapes), or --config PATH|HF_ID to read "
                "them from the model's config.json",
                param_hint="--config",
            )
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
