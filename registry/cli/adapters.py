"""``loraplane adapters …``: create/update adapters, push versions, list/show, quality gates,
promote/canary/rollback, kill switches, prewarm, replicas and the audit log — all through the
admin API."""

from __future__ import annotations

import json
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TextColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)

from registry.admin_client import AdminAPIError, AdminClient, adapter_files
from registry.cli._common import (
    CliOptions,
    Column,
    admin_command,
    client,
    emit,
    err_console,
    fail,
    field,
    fmt,
    human_bytes,
    new_group,
    normalise_version,
    out_console,
    print_json,
    print_record,
    print_rows,
)
from registry.cli.tables import extra, text

adapters_app = new_group(
    "Adapters and their versions: create, update, push, list, show, promote, rollback, disable, enable."
)

AdapterArg = Annotated[str, typer.Argument(help="Adapter id.")]
VersionArg = Annotated[str, typer.Argument(help="Version, e.g. v3 (or 3).")]


class GateStatus(StrEnum):
    """A quality-gate status (``passed``/``skipped`` allow promotion, ``pending``/``failed`` block it)."""

    passed = "passed"
    failed = "failed"
    pending = "pending"
    skipped = "skipped"


class UploadGate(StrEnum):
    """The quality gate a new version starts with."""

    pending = "pending"
    skipped = "skipped"


class LoadFailurePolicy(StrEnum):
    """What is served when the selected version cannot be (SPEC §15)."""

    error = "error"
    previous_version = "previous_version"
    base_model = "base_model"


OnLoadFailureOpt = Annotated[
    LoadFailurePolicy | None,
    typer.Option(
        "--on-load-failure",
        help="When the selected version cannot be served after the router's retry (load failed, hash "
        "mismatch, load timeout, no capacity): 'error' (503, the server's default), 'previous_version' "
        "(the version it replaced) or 'base_model' (the bare base model).",
    ),
]

QualityGateOpt = Annotated[
    UploadGate | None,
    typer.Option(
        "--quality-gate",
        help="Start the version's quality gate as 'pending' (promotion waits for `adapters gate "
        "--status passed`, or --force) or 'skipped' (the server's default).",
    ),
]

_ADAPTER_COLUMNS: list[Column] = [
    ("id", field("id")),
    extra("base model", field("base_model")),
    ("status", field("status")),
    ("active", field("active_version")),
    (
        "canary",
        lambda a: f"{a['canary_version']} ({a.get('canary_weight')}%)" if a.get("canary_version") else None,
    ),
    ("hot", field("hot")),
    extra("owner", field("owner")),
    extra("created", field("created_at")),
    text("description", field("description")),
]
_VERSION_COLUMNS: list[Column] = [
    ("version", field("version")),
    ("status", field("status")),
    ("rank", field("rank")),
    ("alpha", field("lora_alpha")),
    ("size", lambda v: human_bytes(sum(int(f.get("size", 0)) for f in v.get("files") or []))),
    ("rollback to", field("rollback_to")),
    ("quality gate", field("quality_gate")),
    extra("created", field("created_at")),
    text("modules", field("target_modules")),
]


def _print_version(version: dict[str, Any], opts: CliOptions, summary: str | None = None) -> None:
    if opts.as_json:
        print_json(version)
        return
    if summary:
        out_console().print(summary)
    print_record(version, title=f"{version.get('adapter_id')} {version.get('version')}", skip=("files",))
    files = version.get("files") or []
    print_rows(
        files,
        [
            ("file", field("name")),
            ("size", lambda f: human_bytes(f.get("size"))),
            ("sha256", field("sha256")),
        ],
        title="Files",
    )


def _print_adapter(adapter: dict[str, Any], opts: CliOptions, versions: list[dict[str, Any]] | None) -> None:
    if opts.as_json:
        print_json(adapter)
        return
    print_record(adapter, title=f"adapter {adapter.get('id')}", skip=("versions",))
    if versions is not None:
        print_rows(versions, _VERSION_COLUMNS, title="Versions")


def _print_change(result: Any, opts: CliOptions, summary: str) -> None:
    """Output of a state change: the API's answer (adapter or version record)."""
    emit(opts, result, summary=summary, skip=("versions", "files"))


def _ensure_adapter(
    admin: AdminClient, adapter_id: str, base: str | None, create: bool, owner: str | None, desc: str | None
) -> None:
    if create and not base:
        raise fail("--create needs --base BASE (the base model of the new adapter)")
    try:
        existing = admin.get_adapter(adapter_id)
    except AdminAPIError as exc:
        if exc.status != 404:
            raise
        if not base:
            raise fail(
                f"adapter '{adapter_id}' does not exist: nothing was uploaded. Pass --base BASE to create "
                "it with this push (`loraplane base-models list` shows the base models), or create it "
                f"first: loraplane adapters create {adapter_id} --base BASE"
            ) from None
        admin.create_adapter(adapter_id, base_model=base, owner=owner, description=desc)
        err_console().print(f"created adapter {adapter_id} on base model {base}")
        return
    if base and existing.get("base_model") not in (None, base):
        raise fail(
            f"adapter '{adapter_id}' belongs to base model '{existing.get('base_model')}', not '{base}'"
        )


@admin_command(adapters_app, "create")
def create(
    opts: CliOptions,
    adapter: AdapterArg,
    base: Annotated[str, typer.Option("--base", help="Base model the adapter is built on.")],
    owner: Annotated[str | None, typer.Option("--owner", help="Owner (team or person).")] = None,
    description: Annotated[str | None, typer.Option("--description", help="Description.")] = None,
    hot: Annotated[
        bool, typer.Option("--hot", help="Mark hot: the router keeps the active version prewarmed.")
    ] = False,
    on_load_failure: OnLoadFailureOpt = None,
) -> None:
    """Create an adapter (no versions yet; `push` uploads them)."""
    policy = on_load_failure.value if on_load_failure is not None else None
    with client(opts) as admin:
        result = admin.create_adapter(
            adapter,
            base_model=base,
            owner=owner,
            description=description,
            hot=hot or None,
            on_load_failure=policy,
        )
    emit(opts, result, summary=f"created adapter {adapter} on base model {base}" + (" (hot)" if hot else ""))


@admin_command(adapters_app, "update")
def update(
    opts: CliOptions,
    adapter: AdapterArg,
    hot: Annotated[
        bool | None,
        typer.Option(
            "--hot/--no-hot", help="Mark (or unmark) hot: the router keeps the active version prewarmed."
        ),
    ] = None,
    description: Annotated[str | None, typer.Option("--description", help="New description.")] = None,
    owner: Annotated[str | None, typer.Option("--owner", help="New owner.")] = None,
    on_load_failure: OnLoadFailureOpt = None,
) -> None:
    """Change an adapter's description, owner, hot mark or load-failure policy (only those given)."""
    policy = on_load_failure.value if on_load_failure is not None else None
    if hot is None and description is None and owner is None and policy is None:
        raise typer.BadParameter(
            "give at least one of --hot/--no-hot, --description, --owner, --on-load-failure"
        )
    with client(opts) as admin:
        result = admin.update_adapter(
            adapter, description=description, owner=owner, hot=hot, on_load_failure=policy
        )
    changed = [] if hot is None else ["marked hot" if hot else "no longer marked hot"]
    changed += [
        f"{name} set" for name, v in (("owner", owner), ("description", description)) if v is not None
    ]
    if policy is not None:
        changed.append(f"on_load_failure {policy}")
    _print_change(result, opts, f"updated {adapter}: {', '.join(changed)}")


@admin_command(adapters_app, "push")
def push(
    opts: CliOptions,
    directory: Annotated[
        Path, typer.Argument(exists=True, file_okay=False, dir_okay=True, help="PEFT LoRA adapter directory.")
    ],
    adapter: Annotated[str, typer.Option("--adapter", "-a", help="Adapter id.")],
    base: Annotated[
        str | None, typer.Option("--base", help="Base model (creates the adapter if missing).")
    ] = None,
    create: Annotated[
        bool, typer.Option("--create", help="Create the adapter first if it does not exist.")
    ] = False,
    owner: Annotated[str | None, typer.Option("--owner", help="Owner of a created adapter.")] = None,
    description: Annotated[
        str | None, typer.Option("--description", help="Description of a created adapter.")
    ] = None,
    quality_gate: QualityGateOpt = None,
) -> None:
    """Upload every file of DIRECTORY as a new version of the adapter (streamed, with a progress bar)."""
    files = adapter_files(directory)
    if not files:
        raise fail(f"no files to upload in {directory}")
    with client(opts) as admin:
        _ensure_adapter(admin, adapter, base, create, owner, description)  # before a byte is sent
        total = sum(p.stat().st_size for p in files)
        progress = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            DownloadColumn(binary_units=True),
            TransferSpeedColumn(),
            TimeRemainingColumn(),
            console=err_console(),
            transient=False,
        )
        with progress:
            task = progress.add_task(f"push {adapter} ({len(files)} files)", total=total)
            version = admin.upload_files(
                adapter,
                files,
                progress=lambda n: progress.advance(task, n),
                quality_gate=quality_gate.value if quality_gate is not None else None,
            )
    _print_version(version, opts, f"uploaded {adapter} {version.get('version')} ({human_bytes(total)})")


@admin_command(adapters_app, "register")
def register(
    opts: CliOptions,
    adapter: AdapterArg,
    source_uri: Annotated[
        str, typer.Argument(help="s3://bucket/prefix/ inside LORAPLANE_ALLOWED_SOURCES of the registry.")
    ],
    quality_gate: QualityGateOpt = None,
) -> None:
    """Register a new version by reference to files already in an allowed bucket/prefix."""
    gate = quality_gate.value if quality_gate is not None else None
    with client(opts) as admin:
        version = admin.register_version(adapter, source_uri, quality_gate=gate)
    _print_version(version, opts, f"registered {adapter} {version.get('version')} from {source_uri}")


@admin_command(adapters_app, "list")
def list_adapters(
    opts: CliOptions,
    base_model: Annotated[str | None, typer.Option("--base-model", help="Only this base model.")] = None,
    owner: Annotated[str | None, typer.Option("--owner", help="Only this owner.")] = None,
    status: Annotated[str | None, typer.Option("--status", help="active | disabled.")] = None,
) -> None:
    """List adapters (every page)."""
    with client(opts) as admin:
        rows = admin.list_adapters(base_model=base_model, owner=owner, status=status)
    emit(opts, rows, columns=_ADAPTER_COLUMNS, title="Adapters")


@admin_command(adapters_app, "show")
def show(opts: CliOptions, adapter: AdapterArg) -> None:
    """Describe an adapter with its versions."""
    with client(opts) as admin:
        record = admin.get_adapter(adapter)
        versions = record.get("versions")
        if versions is None:
            versions = admin.list_versions(adapter)
    _print_adapter(record, opts, versions)


@admin_command(adapters_app, "versions")
def show_version(
    opts: CliOptions,
    adapter: AdapterArg,
    version: Annotated[str | None, typer.Argument(help="One version to describe (else list them).")] = None,
) -> None:
    """List an adapter's versions, or describe one with its files and hashes."""
    with client(opts) as admin:
        if version is not None:
            _print_version(admin.get_version(adapter, normalise_version(version)), opts)
            return
        rows = admin.list_versions(adapter)
    emit(opts, rows, columns=_VERSION_COLUMNS, title="Versions")


@admin_command(adapters_app, "promote")
def promote(
    opts: CliOptions,
    adapter: AdapterArg,
    version: VersionArg,
    canary: Annotated[
        int | None,
        typer.Option("--canary", min=1, max=99, help="Canary with this share of traffic (1-99 %)."),
    ] = None,
    force: Annotated[
        bool,
        typer.Option(
            "--force",
            help="Promote even if the version's quality gate is pending or failed (audited).",
        ),
    ] = False,
) -> None:
    """Make a version active, or a canary with --canary WEIGHT (refused while its quality gate is
    pending or failed, unless --force)."""
    v = normalise_version(version)
    with client(opts) as admin:
        result = admin.promote(adapter, v, canary_weight=canary, force=force)
    if "requested_by" in result:  # 202: approvals are required (SPEC §14)
        n = result.get("approvals_required")
        forced = " (forced past its quality gate)" if result.get("force") else ""
        summary = (
            f"promotion request {result['id']}{forced} pending: needs {n} approval(s) "
            f"(loraplane promotions approve {result['id']})"
        )
        emit(opts, result, summary=summary)
        return
    what = f"canary at {canary}%" if canary is not None else "active"
    _print_change(result, opts, f"{adapter} {v} is now {what}")
    if not opts.as_json:
        _warn_if_ungranted(admin_opts=opts, adapter=adapter, base=result.get("base_model"))


def _warn_if_ungranted(*, admin_opts: CliOptions, adapter: str, base: str | None) -> None:
    """After a promote: when no tenant may call the adapter yet, say so and how to grant it (a
    newcomer's first request would otherwise get 404 model_not_found)."""
    try:
        with client(admin_opts) as admin:
            granted = admin.list_tenants(adapter_id=adapter, limit=1)
    except AdminAPIError:
        return  # e.g. a principal that may not list tenants: no hint rather than an error
    if not granted:
        model = f"{base}:{adapter}" if base else adapter
        err_console().print(
            f"note: no tenant is granted {adapter} yet, so requests for {model} get 404 "
            f"model_not_found. Grant it: loraplane tenants grant TENANT {adapter}"
        )


def _details_arg(value: str | None) -> dict[str, Any] | None:
    """``--details`` as JSON text, or ``@FILE`` holding it; it must be a JSON object."""
    if value is None:
        return None
    text = value
    if value.startswith("@"):
        try:
            text = Path(value[1:]).read_text(encoding="utf-8")
        except OSError as exc:
            raise typer.BadParameter(
                f"cannot read {value[1:]}: {exc.strerror}", param_hint="--details"
            ) from None
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise typer.BadParameter(f"not valid JSON: {exc}", param_hint="--details") from None
    if not isinstance(data, dict):
        raise typer.BadParameter("must be a JSON object, e.g. '{\"accuracy\": 0.91}'", param_hint="--details")
    return data


@admin_command(adapters_app, "gate")
def gate(
    opts: CliOptions,
    adapter: AdapterArg,
    version: VersionArg,
    status: Annotated[
        GateStatus,
        typer.Option(
            "--status", help="passed | failed | pending | skipped (pending and failed block promotion)."
        ),
    ],
    details: Annotated[
        str | None,
        typer.Option(
            "--details",
            help="JSON object recorded with the result (e.g. eval scores), or @FILE holding one.",
        ),
    ] = None,
) -> None:
    """Record a version's quality-gate result (e.g. from CI after an eval run)."""
    v = normalise_version(version)
    body = _details_arg(details)
    with client(opts) as admin:
        result = admin.set_quality_gate(adapter, v, status.value, details=body)
    _print_version(result, opts, f"{adapter} {v} quality gate: {status.value}")


@admin_command(adapters_app, "rollback")
def rollback(opts: CliOptions, adapter: AdapterArg) -> None:
    """While a canary runs: end it, keeping the active version. Otherwise restore the version that
    was active before the current one."""
    with client(opts) as admin:
        result = admin.rollback(adapter)
    active = result.get("active_version") if isinstance(result, dict) else None
    _print_change(result, opts, f"{adapter} rolled back; active version: {fmt(active)}")


@admin_command(adapters_app, "disable")
def disable(opts: CliOptions, adapter: AdapterArg) -> None:
    """Kill switch: every request for the adapter fails fast and replicas unload it."""
    with client(opts) as admin:
        result = admin.disable_adapter(adapter)
    _print_change(result, opts, f"{adapter} disabled")


@admin_command(adapters_app, "enable")
def enable(opts: CliOptions, adapter: AdapterArg) -> None:
    """Undo `disable`: the adapter is served as before."""
    with client(opts) as admin:
        result = admin.enable_adapter(adapter)
    _print_change(result, opts, f"{adapter} enabled")


@admin_command(adapters_app, "disable-version")
def disable_version(opts: CliOptions, adapter: AdapterArg, version: VersionArg) -> None:
    """Block one version (it can no longer be served or promoted; the active one rolls back)."""
    v = normalise_version(version)
    with client(opts) as admin:
        result = admin.disable_version(adapter, v)
    _print_change(result, opts, f"{adapter} {v} disabled")


@admin_command(adapters_app, "enable-version")
def enable_version(opts: CliOptions, adapter: AdapterArg, version: VersionArg) -> None:
    """Undo `disable-version`: the version is ready again (promotable; its quality gate as it was)."""
    v = normalise_version(version)
    with client(opts) as admin:
        result = admin.enable_version(adapter, v)
    _print_change(result, opts, f"{adapter} {v} enabled (ready)")
