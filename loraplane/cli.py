"""The one CLI: ``loraplane``. Each package contributes its commands; this module only assembles.

Sub-apps (module attribute → command group):
  registry.cli:db_app            → loraplane db upgrade|current
  registry.cli:adapters_app      → loraplane adapters push|list|show|promote|rollback|disable|enable
  registry.cli:tenants_app       → loraplane tenants create|key|revoke|grant|limits|list
  registry.cli:base_models_app   → loraplane base-models add|list
  registry.cli:owners_app        → loraplane owners limits|show
  registry.cli:principals_app    → loraplane principals create|list|show|update|token|revoke
  registry.cli:promotions_app    → loraplane promotions list|show|approve|reject
  registry.cli:bulk_app          → loraplane bulk rollback|disable|enable
  registry.cli:replicas_app      → loraplane replicas list|plan
  registry.cli:contexts_app      → loraplane contexts list|use
Single commands (module attribute → command):
  simulator.cli:simulate         → loraplane simulate --port P --model NAME …
  loraplane.up:up                → loraplane up
  loraplane.serve:serve          → loraplane serve --role registry|gateway|all
  router.agent:agent             → loraplane agent
  registry.cli:login             → loraplane login --url … --token … [--context NAME]
  registry.cli:whoami            → loraplane whoami
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path

import typer

app = typer.Typer(
    name="loraplane",
    help="Serve many LoRA adapters for many tenants from one pool of vLLM replicas.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)

_GROUPS = [
    ("registry.cli", "db_app", "db"),
    ("registry.cli", "adapters_app", "adapters"),
    ("registry.cli", "tenants_app", "tenants"),
    ("registry.cli", "base_models_app", "base-models"),
    ("registry.cli", "owners_app", "owners"),
    ("registry.cli", "principals_app", "principals"),
    ("registry.cli", "promotions_app", "promotions"),
    ("registry.cli", "bulk_app", "bulk"),
    ("registry.cli", "replicas_app", "replicas"),
    ("registry.cli", "contexts_app", "contexts"),
]
_COMMANDS = [
    ("simulator.cli", "simulate", "simulate"),
    ("loraplane.up", "up", "up"),
    ("loraplane.serve", "serve", "serve"),
    ("router.agent", "agent", "agent"),
    ("registry.cli", "login", "login"),
    ("registry.cli", "whoami", "whoami"),
]


def _root(
    ctx: typer.Context,
    url: str | None = typer.Option(
        None, "--url", help="Admin API base URL for the command (env LORAPLANE_ADMIN_URL)."
    ),
    token: str | None = typer.Option(None, "--token", help="Admin bearer token (env LORAPLANE_ADMIN_TOKEN)."),
    context: str | None = typer.Option(
        None,
        "--context",
        help="Saved credentials to use (`loraplane login`, `up`: 'local') (env LORAPLANE_CONTEXT).",
    ),
    as_json: bool = typer.Option(False, "--json", help="Print raw JSON answers instead of tables."),
    wide: bool = typer.Option(False, "--wide", help="Tables: never cut or leave out a column."),
) -> None:
    """loraplane — LoRA adapters as a service on a shared pool of vLLM replicas.

    Global options go before the command (`loraplane --context prod adapters list`) and apply to
    every admin API command; the same options after the command win over them."""
    if url or token or context or as_json or wide:
        from registry.cli._common import CliOptions

        ctx.obj = CliOptions(url, token, as_json, context, wide)


app.callback()(_root)


def _load(module: str, attr: str) -> object | None:
    if importlib.util.find_spec(module) is None:
        return None
    return getattr(importlib.import_module(module), attr, None)


_VALUED = {"--url", "--token", "--context"}  # the root options that take a value


def _requested() -> str | None:
    """The sub-command named on the command line, if any (``loraplane --context x adapters list``
    → adapters), only when this process *is* the CLI (console script or ``python -m
    loraplane.cli``); an importer such as a test runner always gets every command."""
    argv0 = Path(sys.argv[0]) if sys.argv and sys.argv[0] else Path()
    if argv0.name != "loraplane" and argv0.resolve() != Path(__file__).resolve():
        return None
    args = iter(sys.argv[1:])
    for arg in args:
        if arg in _VALUED:
            next(args, None)
        elif not arg.startswith("-"):
            return arg
    return None


# Import only the package the command line asks for (``loraplane adapters list`` need not import
# the router, aiohttp and uvicorn); ``--help`` or an unknown name loads everything.
_wanted = _requested()
_known = {name for _, _, name in _GROUPS + _COMMANDS}
_only = _wanted if _wanted in _known else None
for _mod, _attr, _name in _GROUPS:
    if _only not in (None, _name):
        continue
    _sub = _load(_mod, _attr)
    if isinstance(_sub, typer.Typer):
        app.add_typer(_sub, name=_name)
for _mod, _attr, _name in _COMMANDS:
    if _only not in (None, _name):
        continue
    _fn = _load(_mod, _attr)
    if callable(_fn):
        app.command(name=_name)(_fn)


@app.command()
def version() -> None:
    """Print the loraplane version."""
    from loraplane import __version__

    typer.echo(__version__)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
