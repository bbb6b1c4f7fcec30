"""``loraplane tenants …``: tenants, their limits, API keys and adapter grants (admin API)."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from registry.cli._common import (
    CliOptions,
    admin_command,
    client,
    emit,
    err_console,
    field,
    new_group,
    out_console,
    parse_limit,
    print_json,
    print_record,
    print_rows,
)

tenants_app = new_group("Tenants, limits, API keys and adapter grants.")

TenantArg = Annotated[str, typer.Argument(help="Tenant id.")]
LimitOpt = Annotated[int | None, typer.Option(min=0, help="Limit (omit for unlimited).")]
LIMIT_KEYS = ("rpm", "tpm", "max_concurrency", "max_cold_waiters")
COLD_HELP = "Requests waiting for a cold adapter load at once, per gateway process (503 beyond it)"


def _limit(t: dict[str, Any], key: str) -> Any:
    limits = t.get("limits") or {}
    value = limits.get(key)
    return "unlimited" if value is None else value


def _print_tenant(tenant: dict[str, Any], opts: CliOptions, summary: str | None = None) -> None:
    if opts.as_json:
        print_json(tenant)
        return
    if summary:
        out_console().print(summary)
    record = dict(tenant)
    limits = record.pop("limits", None) or {}
    for key in LIMIT_KEYS:
        record[key] = "unlimited" if limits.get(key) is None else limits[key]
    print_record(record, title=f"tenant {tenant.get('id')}", skip=("grants", "keys"))
    if isinstance(tenant.get("grants"), list):
        print_rows(
            tenant["grants"],
            [("adapter", field("adapter_id")), ("rpm", field("rpm")), ("tpm", field("tpm"))],
            title="Grants",
        )
    if isinstance(tenant.get("keys"), list):
        print_rows(
            tenant["keys"],
            [
                ("key id", field("key_id")),
                ("prefix", field("prefix")),
                ("created", field("created_at")),
                ("revoked", field("revoked_at")),
            ],
            title="Keys",
        )


def _print_removal(opts: CliOptions, result: Any, fallback: dict[str, Any], summary: str) -> None:
    """Output of a revoke/ungrant: the API's answer (FALLBACK when it had no body) with ``--json``,
    else just the SUMMARY line."""
    if opts.as_json:
        print_json(result if result is not None else fallback)
    else:
        out_console().print(summary)


@admin_command(tenants_app, "create")
def create(
    opts: CliOptions,
    tenant: TenantArg,
    name: Annotated[str | None, typer.Option("--name", help="Display name (default: the id).")] = None,
    rpm: Annotated[int | None, typer.Option("--rpm", min=0, help="Requests per minute.")] = None,
    tpm: Annotated[int | None, typer.Option("--tpm", min=0, help="Tokens per minute.")] = None,
    max_concurrency: Annotated[
        int | None, typer.Option("--max-concurrency", min=0, help="Concurrent requests.")
    ] = None,
    max_cold_waiters: Annotated[
        int | None, typer.Option("--max-cold-waiters", min=0, help=f"{COLD_HELP}.")
    ] = None,
    base_model_access: Annotated[
        bool, typer.Option("--base-model-access", help="May call the bare base model.")
    ] = False,
) -> None:
    """Create a tenant (limits unset = unlimited)."""
    limits = {"rpm": rpm, "tpm": tpm, "max_concurrency": max_concurrency}
    if max_cold_waiters is not None:  # sent only when given (an older registry refuses the key)
        limits["max_cold_waiters"] = max_cold_waiters
    with client(opts) as admin:
        result = admin.create_tenant(tenant, name=name, limits=limits, base_model_access=base_model_access)
    _print_tenant(result, opts, f"created tenant {tenant}")


@admin_command(tenants_app, "list")
def list_tenants(opts: CliOptions) -> None:
    """List tenants (every page)."""
    with client(opts) as admin:
        rows = admin.list_tenants()
    emit(
        opts,
        rows,
        columns=[
            ("id", field("id")),
            ("name", field("name")),
            ("rpm", lambda t: _limit(t, "rpm")),
            ("tpm", lambda t: _limit(t, "tpm")),
            ("concurrency", lambda t: _limit(t, "max_concurrency")),
            ("cold waiters", lambda t: _limit(t, "max_cold_waiters")),
            ("base access", field("base_model_access")),
            ("created", field("created_at")),
        ],
        title="Tenants",
    )


@admin_command(tenants_app, "show")
def show(opts: CliOptions, tenant: TenantArg) -> None:
    """Describe a tenant."""
    with client(opts) as admin:
        result = admin.get_tenant(tenant)
    _print_tenant(result, opts)


@admin_command(tenants_app, "key")
def key(opts: CliOptions, tenant: TenantArg) -> None:
    """Issue an API key for the tenant. The key is printed once and can never be shown again."""
    with client(opts) as admin:
        result = admin.issue_key(tenant)
    err_console().print(
        "[yellow]warning:[/] this API key is shown only now and cannot be retrieved again; store it safely."
    )
    if opts.as_json:
        print_json(result)
        return
    out_console().print(f"key id: {result.get('key_id')}  prefix: {result.get('prefix')}")
    # the key alone on its own line, easy to copy or capture with $(…)
    typer.echo(result.get("key"))


@admin_command(tenants_app, "revoke")
def revoke(
    opts: CliOptions,
    tenant: TenantArg,
    key_id: Annotated[str, typer.Argument(help="Key id (from `tenants key`).")],
) -> None:
    """Revoke one API key of the tenant."""
    with client(opts) as admin:
        result = admin.revoke_key(tenant, key_id)
    revoked = {"tenant_id": tenant, "key_id": key_id, "revoked": True}
    _print_removal(opts, result, revoked, f"revoked key {key_id} of tenant {tenant}")


@admin_command(tenants_app, "grant")
def grant(
    opts: CliOptions,
    tenant: TenantArg,
    adapter: Annotated[str, typer.Argument(help="Adapter id.")],
    rpm: Annotated[int | None, typer.Option("--rpm", min=0, help="Per-grant requests per minute.")] = None,
    tpm: Annotated[int | None, typer.Option("--tpm", min=0, help="Per-grant tokens per minute.")] = None,
) -> None:
    """Let the tenant use an adapter (optionally with its own rpm/tpm)."""
    with client(opts) as admin:
        result = admin.put_grant(tenant, adapter, rpm=rpm, tpm=tpm)
    emit(opts, result, summary=f"granted {adapter} to {tenant}")


@admin_command(tenants_app, "ungrant")
def ungrant(
    opts: CliOptions,
    tenant: TenantArg,
    adapter: Annotated[str, typer.Argument(help="Adapter id.")],
) -> None:
    """Remove the tenant's grant for an adapter."""
    with client(opts) as admin:
        result = admin.delete_grant(tenant, adapter)
    removed = {"tenant_id": tenant, "adapter_id": adapter, "removed": True}
    _print_removal(opts, result, removed, f"removed grant of {adapter} from {tenant}")


@admin_command(tenants_app, "limits")
def limits(
    opts: CliOptions,
    tenant: TenantArg,
    rpm: Annotated[
        str | None, typer.Option("--rpm", help="Requests per minute, or 'none' (unlimited).")
    ] = None,
    tpm: Annotated[str | None, typer.Option("--tpm", help="Tokens per minute, or 'none'.")] = None,
    max_concurrency: Annotated[
        str | None, typer.Option("--max-concurrency", help="Concurrent requests, or 'none'.")
    ] = None,
    max_cold_waiters: Annotated[
        str | None, typer.Option("--max-cold-waiters", help=f"{COLD_HELP}, or 'none'.")
    ] = None,
    base_model_access: Annotated[
        bool | None,
        typer.Option("--base-model-access/--no-base-model-access", help="May call the bare base model."),
    ] = None,
    name: Annotated[str | None, typer.Option("--name", help="New display name.")] = None,
) -> None:
    """Change a tenant's limits (only those given; 'none' = unlimited) or base-model access."""
    patch: dict[str, int | None] = {}
    for key_name, flag, raw in (
        ("rpm", "rpm", rpm),
        ("tpm", "tpm", tpm),
        ("max_concurrency", "max-concurrency", max_concurrency),
        ("max_cold_waiters", "max-cold-waiters", max_cold_waiters),
    ):
        given, value = parse_limit(raw, flag)
        if given:
            patch[key_name] = value
    if not patch and base_model_access is None and name is None:
        raise typer.BadParameter(
            "give at least one of --rpm, --tpm, --max-concurrency, --max-cold-waiters, "
            "--[no-]base-model-access, --name"
        )
    with client(opts) as admin:
        result = admin.update_tenant(
            tenant, name=name, limits=patch or None, base_model_access=base_model_access
        )
    _print_tenant(result, opts, f"updated tenant {tenant}")
