"""``loraplane adapters import hf://ORG/REPO@REVISION[/SUBDIR] --adapter ID``: a new version from
the Hugging Face Hub. The registry fetches the files itself (the repository must match an
``hf://`` pattern of its ``LORAPLANE_ALLOWED_SOURCES``), pins the revision to its commit sha,
checks each file against the hub's LFS sha256 and validates it like an upload."""

from __future__ import annotations

from typing import Annotated

import typer

from registry.cli._common import (
    CliOptions,
    admin_command,
    client,
    field,
    human_bytes,
    out_console,
    print_json,
    print_record,
    print_rows,
)
from registry.cli.adapters import QualityGateOpt, adapters_app


@admin_command(adapters_app, "import")
def import_version(
    opts: CliOptions,
    source_uri: Annotated[
        str,
        typer.Argument(
            metavar="hf://ORG/REPO@REVISION[/SUBDIR]",
            help="Hugging Face model repository, revision (branch, tag or commit sha; default main) "
            "and optional directory inside it.",
        ),
    ],
    adapter: Annotated[str, typer.Option("--adapter", "-a", help="Adapter id (it must exist).")],
    quality_gate: QualityGateOpt = None,
) -> None:
    """Import a new version of the adapter from the Hugging Face Hub (the registry fetches it)."""
    if not source_uri.startswith("hf://"):
        raise typer.BadParameter(
            "expected hf://ORG/REPO@REVISION[/SUBDIR]; for s3:// use `adapters register`", param_hint="SOURCE"
        )
    gate = quality_gate.value if quality_gate is not None else None
    with client(opts) as admin:
        version = admin.import_version(adapter, source_uri, quality_gate=gate)
    if opts.as_json:
        print_json(version)
        return
    files = version.get("files") or []
    total = sum(int(f.get("size") or 0) for f in files)
    out_console().print(
        f"imported {adapter} {version.get('version')} from {version.get('source_uri')} "
        f"at commit {version.get('source_revision')} ({len(files)} files, {human_bytes(total)})"
    )
    print_record(version, title=f"{version.get('adapter_id')} {version.get('version')}", skip=("files",))
    columns = [
        ("file", field("name")),
        ("size", lambda f: human_bytes(f.get("size"))),
        ("sha256", field("sha256")),
    ]
    print_rows(files, columns, title="Files")
