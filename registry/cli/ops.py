"""``loraplane adapters prewarm|replicas|audit``: the operational view — what runs where, and
what changed when. Registered on the ``adapters`` group (see :mod:`registry.cli.adapters`)."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from registry.cli._common import CliOptions, Column, admin_command, client, emit, field
from registry.cli.adapters import AdapterArg, _print_change, adapters_app
from registry.cli.tables import extra, text


@admin_command(adapters_app, "prewarm")
def prewarm(
    opts: CliOptions,
    adapter: AdapterArg,
    replicas: Annotated[
        int | None, typer.Option("--replicas", min=1, help="How many replicas to load it on.")
    ] = None,
) -> None:
    """Load the active version onto N replicas now."""
    with client(opts) as admin:
        result = admin.prewarm(adapter, replicas)
    _print_change(result, opts, f"prewarm of {adapter} requested")


def _loaded(replica: dict[str, Any]) -> str:
    items = [
        f"{a.get('adapter')}@{a.get('version')} ({a.get('state')})" for a in replica.get("adapters") or []
    ]
    return "\n".join(items) or "-"


REPLICA_COLUMNS: list[Column] = [
    ("url", field("url")),
    ("pool", field("pool")),
    ("base model", field("base_model")),
    ("healthy", field("healthy")),
    ("running", field("running")),
    ("waiting", field("waiting")),
    text("adapters", _loaded),
    extra("last seen", field("last_seen")),
]


@admin_command(adapters_app, "replicas")
def replicas(opts: CliOptions) -> None:
    """Every replica: health, adapters loaded, requests running/waiting (also `replicas list`)."""
    with client(opts) as admin:
        rows = admin.list_replicas()
    emit(opts, rows, columns=REPLICA_COLUMNS, title="Replicas")


@admin_command(adapters_app, "audit")
def audit(
    opts: CliOptions,
    action: Annotated[str | None, typer.Option("--action", help="e.g. version.promoted")] = None,
    subject_type: Annotated[
        str | None, typer.Option("--subject-type", help="adapter | tenant | base_model")
    ] = None,
    subject_id: Annotated[str | None, typer.Option("--subject-id", help="Adapter or tenant id.")] = None,
    since: Annotated[
        str | None, typer.Option("--since", help="ISO 8601 time, e.g. 2026-01-01T00:00:00Z")
    ] = None,
    limit: Annotated[
        int, typer.Option("--limit", min=1, help="At most this many events: the most recent ones.")
    ] = 50,
    oldest_first: Annotated[
        bool,
        typer.Option(
            "--oldest-first", help="The oldest events (from --since) first, instead of the newest first."
        ),
    ] = False,
) -> None:
    """The audit log, newest first: every admin change, load, unload, failure."""
    with client(opts) as admin:
        rows = admin.list_audit(
            action=action,
            subject_type=subject_type,
            subject_id=subject_id,
            since=since,
            limit=limit,
            newest_first=not oldest_first,
        )
    emit(
        opts,
        rows,
        columns=[
            ("time", field("ts")),
            ("actor", field("actor")),
            ("action", field("action")),
            ("subject", field("subject_id")),
            extra("type", field("subject_type")),
            text("details", field("details")),
        ],
        title="Audit events" + (" (oldest first)" if oldest_first else " (newest first)"),
    )
