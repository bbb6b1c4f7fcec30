"""``loraplane adapters prewarm|replicas|audit``: the operational view — what runs where, and
what changed when. Registered on the ``adapters`` group (see :mod:`registry.cli.adapters`)."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from registry.cli._common import (
    JsonOpt,
    TokenOpt,
    UrlOpt,
    client,
    field,
    handle_errors,
    options,
    print_json,
    print_rows,
)
from registry.cli.adapters import AdapterArg, _print_change, adapters_app


@adapters_app.command("prewarm")
@handle_errors
def prewarm(
    ctx: typer.Context,
    adapter: AdapterArg,
    replicas: Annotated[
        int | None, typer.Option("--replicas", min=1, help="How many replicas to load it on.")
    ] = None,
    url: UrlOpt = None,
    token: TokenOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Load the active version onto N replicas now."""
    opts = options(ctx, url, token, as_json)
    with client(opts) as admin:
        result = admin.prewarm(adapter, replicas)
    _print_change(result, opts, f"prewarm of {adapter} requested")


def _loaded(replica: dict[str, Any]) -> str:
    items = [
        f"{a.get('adapter')}@{a.get('version')} ({a.get('state')})" for a in replica.get("adapters") or []
    ]
    return "\n".join(items) or "-"


@adapters_app.command("replicas")
@handle_errors
def replicas(
    ctx: typer.Context, url: UrlOpt = None, token: TokenOpt = None, as_json: JsonOpt = False
) -> None:
    """Every replica: health, adapters loaded, requests running/waiting."""
    opts = options(ctx, url, token, as_json)
    with client(opts) as admin:
        rows = admin.list_replicas()
    if opts.as_json:
        print_json(rows)
        return
    print_rows(
        rows,
        [
            ("url", field("url")),
            ("pool", field("pool")),
            ("base model", field("base_model")),
            ("healthy", field("healthy")),
            ("running", field("running")),
            ("waiting", field("waiting")),
            ("adapters", _loaded),
            ("last seen", field("last_seen")),
        ],
        title="Replicas",
    )


@adapters_app.command("audit")
@handle_errors
def audit(
    ctx: typer.Context,
    action: Annotated[str | None, typer.Option("--action", help="e.g. version.promoted")] = None,
    subject_type: Annotated[
        str | None, typer.Option("--subject-type", help="adapter | tenant | base_model")
    ] = None,
    subject_id: Annotated[str | None, typer.Option("--subject-id", help="Adapter or tenant id.")] = None,
    since: Annotated[
        str | None, typer.Option("--since", help="ISO 8601 time, e.g. 2026-01-01T00:00:00Z")
    ] = None,
    limit: Annotated[int, typer.Option("--limit", min=1, help="At most this many events.")] = 50,
    url: UrlOpt = None,
    token: TokenOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """The audit log: every admin change, load, unload, failure."""
    opts = options(ctx, url, token, as_json)
    with client(opts) as admin:
        rows = admin.list_audit(
            action=action, subject_type=subject_type, subject_id=subject_id, since=since, limit=limit
        )
    if opts.as_json:
        print_json(rows)
        return
    print_rows(
        rows,
        [
            ("time", field("ts")),
            ("actor", field("actor")),
            ("action", field("action")),
            ("subject", lambda e: f"{e.get('subject_type')}:{e.get('subject_id')}"),
            ("details", field("details")),
        ],
        title="Audit events",
    )
