"""``loraplane login|whoami``, ``loraplane principals …``, ``loraplane promotions …`` and
``loraplane adapters approvals`` (SPEC §14).

``login`` checks the token against ``/whoami`` before saving it (:mod:`registry.cli.contexts`);
``principals create`` also issues the first token (``--no-token`` skips it), printed once.
"""

from __future__ import annotations

from typing import Annotated, Any

import typer

from registry.admin_client import DEFAULT_ADMIN_URL, AdminAPIError, AdminClient, AdminUnreachable
from registry.cli._common import (
    CliOptions,
    ContextOpt,
    JsonOpt,
    TokenOpt,
    UrlOpt,
    admin_command,
    client,
    credentials,
    emit,
    fail,
    field,
    handle_errors,
    inherited,
    merge,
    new_group,
    out_console,
    print_json,
)
from registry.cli.adapters import adapters_app
from registry.cli.contexts import DEFAULT_CONTEXT, save_context

principals_app = new_group("Admin principals (who may call the admin API) and their tokens.")
promotions_app = new_group("Promotion requests waiting for approval: list, show, approve, reject.")

ROLES_HELP = "viewer, maintainer, approver, operator or admin"


def _owners(value: str | None) -> list[str] | None:
    if value is None:
        return None
    return [o.strip() for o in value.split(",") if o.strip()]


def _principal_summary(p: dict[str, Any]) -> str:
    owners = f", owners {', '.join(p['owners'])}" if p.get("owners") else ""
    return f"{p['id']} ({p['role']}{owners})"


# --------------------------------------------------------------------------- login / whoami


@handle_errors
def login(
    ctx: typer.Context,
    url: Annotated[str, typer.Option("--url", help="Admin API base URL.")] = DEFAULT_ADMIN_URL,
    token: Annotated[
        str, typer.Option("--token", prompt=True, hide_input=True, help="The principal's lpa-… token.")
    ] = "",
    context: Annotated[
        str | None,
        typer.Option(
            "--context",
            help="Name of the saved credentials (the current context after this) (default: 'default').",
        ),
    ] = None,
) -> None:
    """Save admin API credentials as a named context (like kubectl) after checking them."""
    context = context or inherited(ctx).context or DEFAULT_CONTEXT
    try:
        with AdminClient(url, token) as admin:
            me = admin.whoami()
    except AdminAPIError as exc:
        raise fail(f"{exc.status} {exc.code}: {exc.message}") from None
    except AdminUnreachable as exc:
        raise fail(f"cannot reach the admin API at {exc.url} (is it running?)", 2) from None
    path = save_context(context, url, token)
    out_console().print(
        f"logged in to {url} as {_principal_summary(me)}; context {context!r} saved in {path}"
    )


@handle_errors
def whoami(
    ctx: typer.Context,
    url: UrlOpt = None,
    token: TokenOpt = None,
    context: ContextOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Who the CLI is talking as: the principal of the token in use, and where it came from."""
    opts = merge(inherited(ctx), CliOptions(url=url, token=token, as_json=as_json, context=context))
    creds = credentials(opts)
    with AdminClient(creds.url, creds.token) as admin:
        me = admin.whoami()
    summary = f"you are {_principal_summary(me)} at {creds.url} ({creds.source})"
    emit(opts, me, summary=None if opts.as_json else summary)


# --------------------------------------------------------------------------- principals

_PRINCIPAL_COLUMNS = [
    ("id", field("id")),
    ("role", field("role")),
    ("owners", field("owners")),
    ("created by", field("created_by")),
    ("created", field("created_at")),
]


def _print_token(opts: CliOptions, principal_id: str, issued: dict[str, Any]) -> None:
    if opts.as_json:
        print_json(issued)
        return
    out_console().print(f"token of {principal_id} (shown once, store it now): {issued['token']}")
    out_console().print(
        f"token id {issued['token_id']} (revoke with: loraplane principals revoke {principal_id} ID)"
    )


@admin_command(principals_app, "create")
def create_principal(
    opts: CliOptions,
    principal_id: Annotated[str, typer.Argument(help="Principal id (slug), e.g. a person or a CI job.")],
    role: Annotated[str, typer.Option("--role", help=ROLES_HELP)],
    owners: Annotated[
        str | None, typer.Option("--owners", help="Comma-separated adapter owners (maintainer, approver).")
    ] = None,
    no_token: Annotated[bool, typer.Option("--no-token", help="Do not issue a first token.")] = False,
) -> None:
    """Create a principal and (unless --no-token) issue its first token, printed once."""
    with client(opts) as admin:
        created = admin.create_principal(principal_id, role, _owners(owners))
        issued = None if no_token else admin.issue_admin_token(principal_id)
    if opts.as_json:
        print_json({"principal": created, "token": issued})
        return
    out_console().print(f"created principal {_principal_summary(created)}")
    if issued is not None:
        _print_token(opts, principal_id, issued)


@admin_command(principals_app, "list")
def list_principals(opts: CliOptions) -> None:
    """List principals."""
    with client(opts) as admin:
        rows = admin.list_principals()
    emit(opts, rows, columns=_PRINCIPAL_COLUMNS, title="Principals")


@admin_command(principals_app, "show")
def show_principal(
    opts: CliOptions, principal_id: Annotated[str, typer.Argument(help="Principal id.")]
) -> None:
    """Describe a principal with its tokens (prefixes only)."""
    with client(opts) as admin:
        rec = admin.get_principal(principal_id)
    if opts.as_json:
        print_json(rec)
        return
    emit(opts, rec, title=f"principal {principal_id}", skip=("tokens",))
    emit(
        opts,
        rec.get("tokens") or [],
        columns=[
            ("token id", field("token_id")),
            ("prefix", field("prefix")),
            ("created", field("created_at")),
            ("revoked", field("revoked_at")),
        ],
        title="Tokens",
    )


@admin_command(principals_app, "update")
def update_principal(
    opts: CliOptions,
    principal_id: Annotated[str, typer.Argument(help="Principal id.")],
    role: Annotated[str | None, typer.Option("--role", help=ROLES_HELP)] = None,
    owners: Annotated[str | None, typer.Option("--owners", help="Comma-separated owners (replaces).")] = None,
) -> None:
    """Change a principal's role and/or owners."""
    with client(opts) as admin:
        rec = admin.update_principal(principal_id, role=role, owners=_owners(owners))
    emit(opts, rec, summary=f"updated {_principal_summary(rec)}", skip=("tokens",))


@admin_command(principals_app, "token")
def issue_token(opts: CliOptions, principal_id: Annotated[str, typer.Argument(help="Principal id.")]) -> None:
    """Issue another token for a principal (printed once)."""
    with client(opts) as admin:
        issued = admin.issue_admin_token(principal_id)
    _print_token(opts, principal_id, issued)


@admin_command(principals_app, "revoke")
def revoke_token(
    opts: CliOptions,
    principal_id: Annotated[str, typer.Argument(help="Principal id.")],
    token_id: Annotated[str, typer.Argument(help="Token id (see: loraplane principals show ID).")],
) -> None:
    """Revoke one token at once (its next call answers 401)."""
    with client(opts) as admin:
        rec = admin.revoke_admin_token(principal_id, token_id)
    emit(opts, rec, summary=f"revoked token {token_id} of {principal_id}")


# --------------------------------------------------------------------------- promotions


def _approvals(p: dict[str, Any]) -> str:
    names = [a["principal"] for a in p.get("approvals") or []]
    return f"{len(names)}/{p.get('approvals_required')}" + (f" ({', '.join(names)})" if names else "")


_PROMOTION_COLUMNS = [
    ("id", field("id")),
    ("adapter", field("adapter_id")),
    ("version", field("version")),
    ("canary %", field("canary_weight")),
    ("force", field("force")),
    ("requested by", field("requested_by")),
    ("status", field("status")),
    ("approvals", _approvals),
    ("expires", field("expires_at")),
]


def promotion_summary(p: dict[str, Any]) -> str:
    what = f"{p['adapter_id']} {p['version']}" + (
        f" as canary at {p['canary_weight']}%" if p.get("canary_weight") is not None else ""
    )
    forced = ", forced past its quality gate" if p.get("force") else ""
    return f"promotion request {p['id']} ({what}{forced}): {p['status']}, approvals {_approvals(p)}"


@admin_command(promotions_app, "list")
def list_promotions(
    opts: CliOptions,
    status: Annotated[
        str | None, typer.Option("--status", help="pending, executed, rejected, expired or stale.")
    ] = None,
    adapter: Annotated[str | None, typer.Option("--adapter", help="Only this adapter's requests.")] = None,
) -> None:
    """List promotion requests, oldest first."""
    with client(opts) as admin:
        rows = admin.list_promotions(status=status, adapter_id=adapter)
    emit(opts, rows, columns=_PROMOTION_COLUMNS, title="Promotion requests")


@admin_command(promotions_app, "show")
def show_promotion(
    opts: CliOptions, promotion_id: Annotated[str, typer.Argument(help="Request id.")]
) -> None:
    """Describe a promotion request."""
    with client(opts) as admin:
        rec = admin.get_promotion(promotion_id)
    emit(opts, rec, title=f"promotion request {promotion_id}")


CommentOpt = Annotated[str | None, typer.Option("--comment", help="Recorded in the audit log.")]


@admin_command(promotions_app, "approve")
def approve(
    opts: CliOptions,
    promotion_id: Annotated[str, typer.Argument(help="Request id.")],
    comment: CommentOpt = None,
) -> None:
    """Approve a request (never your own); the last approval needed executes the promotion."""
    with client(opts) as admin:
        rec = admin.approve_promotion(promotion_id, comment)
    emit(opts, rec, summary=promotion_summary(rec))


@admin_command(promotions_app, "reject")
def reject(
    opts: CliOptions,
    promotion_id: Annotated[str, typer.Argument(help="Request id.")],
    comment: CommentOpt = None,
) -> None:
    """Reject a request."""
    with client(opts) as admin:
        rec = admin.reject_promotion(promotion_id, comment)
    emit(opts, rec, summary=promotion_summary(rec))


# --------------------------------------------------------------------------- approvals_required


@admin_command(adapters_app, "approvals")
def adapter_approvals(
    opts: CliOptions,
    adapter: Annotated[str, typer.Argument(help="Adapter id.")],
    required: Annotated[
        str, typer.Argument(help="Approvals a promotion needs, or 'inherit' (the base model's).")
    ],
) -> None:
    """Set how many approvals a promotion of this adapter needs (admin only)."""
    if required.strip().lower() == "inherit":
        n: int | None = None
    else:
        try:
            n = int(required)
        except ValueError:
            raise typer.BadParameter("an integer ≥ 0 or 'inherit'", param_hint="REQUIRED") from None
    with client(opts) as admin:
        rec = admin.set_adapter_approvals(adapter, n)
    shown = "the base model's" if n is None else str(n)
    emit(opts, rec, summary=f"{adapter}: approvals required = {shown}", skip=("versions",))
