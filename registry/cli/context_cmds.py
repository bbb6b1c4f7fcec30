"""``loraplane contexts list|use``: the saved credentials (``loraplane login``, ``loraplane up``'s
``local``) and which one is current. Tokens are never printed."""

from __future__ import annotations

from typing import Annotated

import typer

from registry.cli._common import JsonOpt, fail, print_json, print_rows
from registry.cli.contexts import ContextError, config_path, list_contexts, use_context

contexts_app = typer.Typer(
    help="Saved admin API credentials (`loraplane login`, `loraplane up`): list them, pick one.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


@contexts_app.command("list")
def list_saved(as_json: JsonOpt = False) -> None:
    """Every saved context: name, URL and whether it is current (never the token)."""
    try:
        current, contexts = list_contexts()
    except ContextError as exc:
        raise fail(str(exc)) from None
    rows = [
        {"name": name, "url": entry.get("url"), "current": name == current}
        for name, entry in sorted(contexts.items())
    ]
    if as_json:
        print_json({"current": current, "contexts": rows, "file": str(config_path())})
        return
    if not rows:
        typer.echo("(no saved contexts: `loraplane login` or `loraplane up` saves one)")
        return
    print_rows(
        rows,
        [("current", lambda r: "*" if r["current"] else ""), ("name", lambda r: r["name"]),
         ("url", lambda r: r["url"])],
        title=None,
    )  # fmt: skip


@contexts_app.command("use")
def use(
    name: Annotated[str, typer.Argument(help="A saved context (see `loraplane contexts list`).")],
) -> None:
    """Make a saved context the current one."""
    try:
        use_context(name)
        _, contexts = list_contexts()
    except ContextError as exc:
        raise fail(str(exc)) from None
    typer.echo(f"current context: {name} ({contexts[name].get('url')})")
