"""``loraplane adapters limits ID`` and ``loraplane owners limits|show OWNER``: limits per adapter
and per owner (SPEC §15), shared by every tenant; the gateway checks them with the tenant and
grant limits in one admission."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from registry.admin_client import AdminAPIError
from registry.cli._common import (
    CliOptions,
    admin_command,
    client,
    new_group,
    out_console,
    parse_limit,
    print_json,
    print_record,
)
from registry.cli.adapters import AdapterArg, adapters_app

owners_app = new_group("Owners of adapters (the business): limits shared by all their adapters.")

OwnerArg = Annotated[str, typer.Argument(help="Owner, as adapters name it in their `owner` field.")]
RpmOpt = Annotated[str | None, typer.Option("--rpm", help="Requests per minute, or 'none' (unlimited).")]
TpmOpt = Annotated[str | None, typer.Option("--tpm", help="Tokens per minute, or 'none'.")]
ConcOpt = Annotated[
    str | None, typer.Option("--max-concurrency", help="Requests in flight at once, or 'none'.")
]
KEYS = ("rpm", "tpm", "max_concurrency")


def limit_flags(rpm: str | None, tpm: str | None, max_concurrency: str | None) -> dict[str, int | None]:
    """The limits given on the command line ('none' = unlimited)."""
    out: dict[str, int | None] = {}
    flags = (
        ("rpm", "rpm", rpm),
        ("tpm", "tpm", tpm),
        ("max_concurrency", "max-concurrency", max_concurrency),
    )
    for key, flag, raw in flags:
        given, value = parse_limit(raw, flag)
        if given:
            out[key] = value
    return out


def _print(record: dict[str, Any], opts: CliOptions, title: str, summary: str | None = None) -> None:
    if opts.as_json:
        print_json(record)
        return
    if summary:
        out_console().print(summary)
    shown = {k: v for k, v in record.items() if k != "limits"}
    limits = record.get("limits") or {}
    for key in KEYS:
        shown[key] = "unlimited" if limits.get(key) is None else limits[key]
    if isinstance(shown.get("adapters"), list):
        shown["adapters"] = ", ".join(shown["adapters"]) or "-"
    print_record(shown, title=title, skip=("versions",))


@admin_command(adapters_app, "limits")
def adapter_limits(
    opts: CliOptions,
    adapter: AdapterArg,
    rpm: RpmOpt = None,
    tpm: TpmOpt = None,
    max_concurrency: ConcOpt = None,
    clear: Annotated[bool, typer.Option("--clear", help="Remove all three limits.")] = False,
) -> None:
    """Set an adapter's limits, shared by every tenant (only those given; 'none' = unlimited)."""
    patch = limit_flags(rpm, tpm, max_concurrency)
    if clear and patch:
        raise typer.BadParameter("--clear takes no --rpm/--tpm/--max-concurrency")
    if not clear and not patch:
        raise typer.BadParameter("give at least one of --rpm, --tpm, --max-concurrency (or --clear)")
    with client(opts) as admin:
        result = admin.set_adapter_limits(adapter, None if clear else patch)
    _print(result, opts, f"adapter {adapter}", f"updated limits of adapter {adapter}")


@admin_command(owners_app, "limits")
def owner_limits(
    opts: CliOptions,
    owner: OwnerArg,
    rpm: RpmOpt = None,
    tpm: TpmOpt = None,
    max_concurrency: ConcOpt = None,
    clear: Annotated[bool, typer.Option("--clear", help="Remove all three limits.")] = False,
) -> None:
    """Set an owner's limits over all its adapters (only those given change; 'none' = unlimited)."""
    patch = limit_flags(rpm, tpm, max_concurrency)
    if clear and patch:
        raise typer.BadParameter("--clear takes no --rpm/--tpm/--max-concurrency")
    if not clear and not patch:
        raise typer.BadParameter("give at least one of --rpm, --tpm, --max-concurrency (or --clear)")
    with client(opts) as admin:
        current: dict[str, Any] = {}
        if not clear:
            try:
                current = dict(admin.get_owner(owner).get("limits") or {})
            except AdminAPIError as e:
                if e.code != "owner_not_found":
                    raise
        limits = {k: current.get(k) for k in KEYS} | patch
        result = admin.put_owner_limits(owner, limits)
    _print(result, opts, f"owner {owner}", f"updated limits of owner {owner}")


@admin_command(owners_app, "show")
def show_owner(opts: CliOptions, owner: OwnerArg) -> None:
    """An owner's limits and the adapters that name it."""
    with client(opts) as admin:
        result = admin.get_owner(owner)
    _print(result, opts, f"owner {owner}")
