"""``loraplane tenants …``: tenants, their limits, API keys and adapter grants (admin API)."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from registry.cli._common import (
    CliOptions,
    JsonOpt,
    TokenOpt,
    UrlOpt,
    client,
    err_console,
    field,
    handle_errors,
    new_group,
    options,
    out_console,
    parse_limit,
    print_json,
    print_record,
    print_rows,
)

tenants_app = new_group("Tenants, limits, API keys and adapter grants.")

TenantArg = Annotated[str, typer.Argument(help="Tenant id.")]
LimitOpt = Annotated[int | None, typer.Option(min=0, help="Limit (omit for unlimited).")]


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
    for key in ("rpm", "tpm", "max_concurrency"):
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


@tenants_app.command("create")
@handle_errors
def create(
    ctx: typer.Context,
    tenant: TenantArg,
    name: Annotated[str | None, typer.Option("--name", help="Display name (default: the id).")] = None,
    rpm: Annotated[int | None, typer.Option("--rpm", min=0, help="Requests per minute.")] = None,
    tpm: Annotated[int | None, typer.Option("--tpm", min=0, help="Tokens per minute.")] = None,
    max_concurrency: Annotated[
        int | None, typer.Option("--max-concurrency", min=0, help="Concurrent requests.")
    ] = None,
    base_model_access: Annotated[
        bool, typer.Option("--base-model-access", help="May call the bare base model.")
    ] = False,
    url: UrlOpt = None,
    token: TokenOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Create a tenant (limits unset = unlimited)."""
    opts = options(ctx, url, token, as_json)
    limits = {"rpm": rpm, "tpm": tpm, "max_concurrency": max_concurrency}
    with client(opts) as admin:
        result = admin.create_tenant(tenant, name=name, limits=limits, base_model_access=base_model_access)
    _print_tenant(result, opts, f"created tenant {tenant}")


@tenants_app.command("list")
@handle_errors
def list_tenants(
    ctx: typer.Context, url: UrlOpt = None, token: TokenOpt = None, as_json: JsonOpt = False
) -> None:
    """List tenants (every page)."""
    opts = options(ctx, url, token, as_json)
    with client(opts) as admin:
        rows = admin.list_tenants()
    if opts.as_json:
        print_json(rows)
        return
    print_rows(
        rows,
        [
            ("id", field("id")),
            ("name", field("name")),
            ("rpm", lambda t: _limit(t, "rpm")),
            ("tpm", lambda t: _limit(t, "tpm")),
            ("concurrency", lambda t: _limit(t, "max_concurrency")),
            ("base access", field("base_model_access")),
            ("created", field("created_at")),
        ],
        title="Tenants",
    )


@tenants_app.command("show")
@handle_errors
def show(
    ctx: typer.Context,
    tenant: TenantArg,
    url: UrlOpt = None,
    token: TokenOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Describe a tenant."""
    opts = options(ctx, url, token, as_json)
    with client(opts) as admin:
        result = admin.get_tenant(tenant)
    _print_tenant(result, opts)


@tenants_app.command("key")
@handle_errors
def key(
    ctx: typer.Context,
    tenant: TenantArg,
    url: UrlOpt = None,
    token: TokenOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Issue an API key for the tenant. The key is printed once and can never be shown again."""
    opts = options(ctx, url, token, as_json)
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


@tenants_app.command("revoke")
@handle_errors
def revoke(
    ctx: typer.Context,
    tenant: TenantArg,
    key_id: Annotated[str, typer.Argument(help="Key id (from `tenants key`).")],
    url: UrlOpt = None,
    token: TokenOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Revoke one API key of the tenant."""
    opts = options(ctx, url, token, as_json)
    with client(opts) as admin:
        result = admin.revoke_key(tenant, key_id)
    if opts.as_json:
        print_json(result if result is not None else {"tenant_id": tenant, "key_id": key_id, "revoked": True})
    else:
        out_console().print(f"revoked key {key_id} of tenant {tenant}")


@tenants_app.command("grant")
@handle_errors
def grant(
    ctx: typer.Context,
    tenant: TenantArg,
    adapter: Annotated[str, typer.Argument(help="Adapter id.")],
    rpm: Annotated[int | None, typer.Option("--rpm", min=0, help="Per-grant requests per minute.")] = None,
    tpm: Annotated[int | None, typer.Option("--tpm", min=0, help="Per-grant tokens per minute.")] = None,
    url: UrlOpt = None,
    token: TokenOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Let the tenant use an adapter (optionally with its own rpm/tpm)."""
    opts = options(ctx, url, token, as_json)
    with client(opts) as admin:
        result = admin.put_grant(tenant, adapter, rpm=rpm, tpm=tpm)
    if opts.as_json:
        print_json(result)
    else:
        out_console().print(f"granted {adapter} to {tenant}")
        print_record(result)


@tenants_app.command("ungrant")
@handle_errors
def ungrant(
    ctx: typer.Context,
    tenant: TenantArg,
    adapter: Annotated[str, typer.Argument(help="Adapter id.")],
    url: UrlOpt = None,
    token: TokenOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Remove the tenant's grant for an adapter."""
    opts = options(ctx, url, token, as_json)
    with client(opts) as admin:
        result = admin.delete_grant(tenant, adapter)
    if opts.as_json:
        print_json(
            result if result is not None else {"tenant_id": tenant, "adapter_id": adapter, "removed": True}
        )
    else:
        out_console().print(f"removed grant of {adapter} from {tenant}")


@tenants_app.command("limits")
@handle_errors
def limits(
    ctx: typer.Context,
    tenant: TenantArg,
    rpm: Annotated[
        str | None, typer.Option("--rpm", help="Requests per minute, or 'none' (unlimited).")
    ] = None,
    tpm: Annotated[str | None, typer.Option("--tpm", help="Tokens per minute, or 'none'.")] = None,
    max_concurrency: Annotated[
        str | None, typer.Option("--max-concurrency", help="Concurrent requests, or 'none'.")
    ] = None,
    base_model_access: Annotated[
        bool | None,
        typer.Option("--base-model-access/--no-base-model-access", help="May call the bare base model."),
    ] = None,
    name: Annotated[str | None, typer.Option("--name", help="New display name.")] = None,
    url: UrlOpt = None,
    token: TokenOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Change a tenant's limits (only those given; 'none' = unlimited) or base-model access."""
    opts = options(ctx, url, token, as_json)
    patch: dict[str, int | None] = {}
    for key_name, flag, raw in (
        ("rpm", "rpm", rpm),
        ("tpm", "tpm", tpm),
        ("max_concurrency", "max-concurrency", max_concurrency),
    ):
        given, value = parse_limit(raw, flag)
        if given:
            patch[key_name] = value
    if not patch and base_model_access is None and name is None:
        raise typer.BadParameter(
            "give at least one of --rpm, --tpm, --max-concurrency, --[no-]base-model-access, --name"
        )
    with client(opts) as admin:
        result = admin.update_tenant(
            tenant, name=name, limits=patch or None, base_model_access=base_model_access
        )
    _print_tenant(result, opts, f"updated tenant {tenant}")
