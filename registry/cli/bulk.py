"""``loraplane bulk rollback|disable|enable`` (SPEC §14): select adapters, see what would
change (a dry run of the API), confirm, apply. Each adapter changes in its own transaction; one
that cannot (409 ``no_rollback_target``) is reported and does not stop the others. Exit status
1 when any adapter failed in the real run."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from registry.cli._common import (
    CliOptions,
    admin_command,
    client,
    emit,
    err_console,
    fail,
    new_group,
    print_json,
)

bulk_app = new_group("Roll back, disable or enable many adapters at once (dry run, then confirm).")


def selector_of(
    adapters: list[str] | None, owner: str | None, base_model: str | None, promoted_since: str | None
) -> dict[str, Any]:
    given = [
        ("adapters", adapters or None),
        ("owner", owner),
        ("base_model", base_model),
        ("promoted_since", promoted_since),
    ]
    chosen = [(k, v) for k, v in given if v]
    if len(chosen) != 1:
        raise fail("give exactly one of --adapter (repeatable), --owner, --base-model, --promoted-since")
    key, value = chosen[0]
    return {key: value}


def _arrow(row: dict[str, Any]) -> str:
    """``v2 → v1``; a refused change ``v1 (unchanged)``; ``-`` where nothing is served."""
    before, after = row.get("from_version"), row.get("to_version")
    if not row.get("ok"):
        return f"{before or '-'} (unchanged)"
    return f"{before or '-'} → {after or '-'}"


def _error(row: dict[str, Any]) -> str | None:
    err = row.get("error")
    return f"{err['code']}: {err['message']}" if err else None


_COLUMNS = [
    ("adapter", lambda r: r.get("adapter_id")),
    ("ok", lambda r: r.get("ok")),
    ("served version", _arrow),
    ("error", _error),
]


def _run(
    action: str,
    opts: CliOptions,
    adapters: list[str] | None,
    owner: str | None,
    base_model: str | None,
    promoted_since: str | None,
    reason: str | None,
    dry_run: bool,
    yes: bool,
) -> None:
    selector = selector_of(adapters, owner, base_model, promoted_since)
    with client(opts) as admin:
        preview = admin.bulk(action, selector, dry_run=True, reason=reason)
        if dry_run:
            summary = f"dry run: {action} would apply to {preview['applied']}, fail for {preview['failed']}"
            emit(opts, preview["results"] if not opts.as_json else preview, columns=_COLUMNS, title=summary)
            return
        if not opts.as_json:
            emit(opts, preview["results"], columns=_COLUMNS, title=f"{action}: what would change")
        if preview["applied"] == 0:
            err_console().print("nothing to change")
            if opts.as_json:
                print_json(preview)
            return
        if not yes:
            typer.confirm(f"{action} {preview['applied']} adapter(s)?", abort=True, err=True)
        result = admin.bulk(action, selector, dry_run=False, reason=reason)
    summary = (
        f"{action}: applied {result['applied']}, failed {result['failed']} (bulk id {result['bulk_id']})"
    )
    if opts.as_json:
        print_json(result)
    else:
        emit(opts, result["results"], columns=_COLUMNS, title=summary)
    if result["failed"]:
        raise typer.Exit(1)


AdapterOpt = Annotated[list[str] | None, typer.Option("--adapter", help="An adapter id (repeatable).")]
OwnerOpt = Annotated[str | None, typer.Option("--owner", help="Every adapter of this owner.")]
BaseOpt = Annotated[str | None, typer.Option("--base-model", help="Every adapter on this base model.")]
SinceOpt = Annotated[
    str | None, typer.Option("--promoted-since", help="Adapters promoted at or after this ISO 8601 time.")
]
ReasonOpt = Annotated[str | None, typer.Option("--reason", help="Recorded in every adapter's audit event.")]
DryOpt = Annotated[bool, typer.Option("--dry-run", help="Only show what would change.")]
YesOpt = Annotated[bool, typer.Option("--yes", "-y", help="Do not ask for confirmation.")]


@admin_command(bulk_app, "rollback")
def rollback(
    opts: CliOptions,
    adapter: AdapterOpt = None,
    owner: OwnerOpt = None,
    base_model: BaseOpt = None,
    promoted_since: SinceOpt = None,
    reason: ReasonOpt = None,
    dry_run: DryOpt = False,
    yes: YesOpt = False,
) -> None:
    """Roll back every selected adapter (those with nothing to roll back to are reported)."""
    _run("rollback", opts, adapter, owner, base_model, promoted_since, reason, dry_run, yes)


@admin_command(bulk_app, "disable")
def disable(
    opts: CliOptions,
    adapter: AdapterOpt = None,
    owner: OwnerOpt = None,
    base_model: BaseOpt = None,
    promoted_since: SinceOpt = None,
    reason: ReasonOpt = None,
    dry_run: DryOpt = False,
    yes: YesOpt = False,
) -> None:
    """Kill switch on for every selected adapter."""
    _run("disable", opts, adapter, owner, base_model, promoted_since, reason, dry_run, yes)


@admin_command(bulk_app, "enable")
def enable(
    opts: CliOptions,
    adapter: AdapterOpt = None,
    owner: OwnerOpt = None,
    base_model: BaseOpt = None,
    promoted_since: SinceOpt = None,
    reason: ReasonOpt = None,
    dry_run: DryOpt = False,
    yes: YesOpt = False,
) -> None:
    """Kill switch off for every selected adapter."""
    _run("enable", opts, adapter, owner, base_model, promoted_since, reason, dry_run, yes)
