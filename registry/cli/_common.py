"""Shared plumbing of the registry CLI: global options, the admin client, error lines, output.

Every command group takes ``--url`` (env ``LORAPLANE_ADMIN_URL``, default
``http://127.0.0.1:8081``), ``--token`` (env ``LORAPLANE_ADMIN_TOKEN``), ``--context`` (env
``LORAPLANE_CONTEXT``: credentials saved by ``loraplane login``) and ``--json``, both on the group
(``loraplane adapters --json list``) and on each command (``loraplane adapters list --json``); the
command's value wins. With no token anywhere, the credentials come from the current context or a
local ``loraplane up`` (:mod:`registry.cli.contexts`).

Commands are declared with :func:`admin_command`, which adds those three options (after the
command's own) and hands the command the merged :class:`CliOptions`; :func:`emit` prints an
answer as JSON or as a table.

Errors never show a traceback: an API error prints ``error: STATUS CODE: MESSAGE`` (plus one
line per problem of an ``invalid_adapter`` answer) on stderr and exits 1; an unreachable
admin API prints ``error: cannot reach the admin API at URL (is it running?)`` and exits 2.
"""

from __future__ import annotations

import functools
import inspect
import json
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, ParamSpec, TypeVar

import typer
from rich.console import Console
from rich.table import Table

from registry.admin_client import AdminAPIError, AdminClient, AdminUnreachable
from registry.cli.contexts import ContextError, Credentials, resolve

P = ParamSpec("P")
R = TypeVar("R")

EXIT_API_ERROR = 1
EXIT_UNREACHABLE = 2

UrlOpt = Annotated[
    str | None,
    typer.Option(
        "--url", help="Admin API base URL [env LORAPLANE_ADMIN_URL, default http://127.0.0.1:8081]."
    ),
]
TokenOpt = Annotated[
    str | None, typer.Option("--token", help="Admin bearer token [env LORAPLANE_ADMIN_TOKEN].")
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print the raw JSON answer instead of tables.")]
ContextOpt = Annotated[
    str | None,
    typer.Option(
        "--context", help="Credentials saved by `loraplane login --context NAME` [env LORAPLANE_CONTEXT]."
    ),
]


@dataclass
class CliOptions:
    url: str | None = None
    token: str | None = None
    as_json: bool = False
    context: str | None = None


def group_callback(
    ctx: typer.Context,
    url: Annotated[
        str | None, typer.Option("--url", envvar="LORAPLANE_ADMIN_URL", help="Admin API base URL.")
    ] = None,
    token: Annotated[
        str | None, typer.Option("--token", envvar="LORAPLANE_ADMIN_TOKEN", help="Admin bearer token.")
    ] = None,
    as_json: JsonOpt = False,
    context: Annotated[
        str | None,
        typer.Option("--context", envvar="LORAPLANE_CONTEXT", help="Credentials saved by `loraplane login`."),
    ] = None,
) -> None:
    """Options shared by every command of the group."""
    ctx.obj = CliOptions(url=url or None, token=token or None, as_json=as_json, context=context or None)


def new_group(help_text: str) -> typer.Typer:
    app = typer.Typer(
        help=help_text, no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False
    )
    app.callback()(group_callback)
    return app


def options(
    ctx: typer.Context, url: str | None, token: str | None, as_json: bool, context: str | None = None
) -> CliOptions:
    """Merge a command's own options over the group's (which already include the env vars)."""
    base = ctx.obj if isinstance(ctx.obj, CliOptions) else CliOptions()
    return CliOptions(
        url=url or base.url,
        token=token or base.token,
        as_json=as_json or base.as_json,
        context=context or base.context,
    )


def credentials(opts: CliOptions) -> Credentials:
    """Flags and env first, then the named or current context, then a local ``loraplane up``."""
    try:
        return resolve(opts.url, opts.token, opts.context)
    except ContextError as exc:
        raise fail(str(exc)) from None


def client(opts: CliOptions) -> AdminClient:
    creds = credentials(opts)
    return AdminClient(creds.url, creds.token)


def err_console() -> Console:
    return Console(stderr=True, highlight=False, soft_wrap=True)


def out_console() -> Console:
    return Console(highlight=False)


def fail(message: str, code: int = EXIT_API_ERROR) -> typer.Exit:
    """Print ``error: MESSAGE`` on stderr and return the Exit to raise."""
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(code)


def handle_errors(fn: Callable[P, R]) -> Callable[P, R]:
    """Turn admin-client errors into one clear line on stderr and an exit code, never a traceback."""

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return fn(*args, **kwargs)
        except AdminAPIError as exc:
            lines = [f"error: {exc.status} {exc.code}: {exc.message}"]
            lines += [f"  - {p}" for p in exc.problems]
            typer.echo("\n".join(lines), err=True)
            raise typer.Exit(EXIT_API_ERROR) from None
        except AdminUnreachable as exc:
            typer.echo(f"error: cannot reach the admin API at {exc.url} (is it running?)", err=True)
            raise typer.Exit(EXIT_UNREACHABLE) from None

    return wrapper


_CTX_PARAM = inspect.Parameter("ctx", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=typer.Context)
_SHARED_PARAMS = [
    inspect.Parameter("url", inspect.Parameter.KEYWORD_ONLY, annotation=UrlOpt, default=None),
    inspect.Parameter("token", inspect.Parameter.KEYWORD_ONLY, annotation=TokenOpt, default=None),
    inspect.Parameter("as_json", inspect.Parameter.KEYWORD_ONLY, annotation=JsonOpt, default=False),
    inspect.Parameter("context", inspect.Parameter.KEYWORD_ONLY, annotation=ContextOpt, default=None),
]


def admin_command(app: typer.Typer, name: str) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """Register ``fn(opts, **own_params)`` as command NAME of APP, a client of the admin API.

    The command typer sees takes the context, ``fn``'s parameters after the first (its arguments
    and options, in order), then ``--url``, ``--token`` and ``--json``; ``fn`` gets those merged
    over the group's (:func:`options`) as its first argument. Errors go through
    :func:`handle_errors`.
    """

    def register(fn: Callable[..., None]) -> Callable[..., None]:
        own = list(inspect.signature(fn, eval_str=True).parameters.values())[1:]
        params = [
            _CTX_PARAM,
            *(p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in own),
            *_SHARED_PARAMS,
        ]

        @functools.wraps(fn)
        def command(
            ctx: typer.Context,
            *,
            url: str | None,
            token: str | None,
            as_json: bool,
            context: str | None,
            **kwargs: Any,
        ) -> None:
            fn(options(ctx, url, token, as_json, context), **kwargs)

        # typer reads the parameters from the signature (and resolves hints from __annotations__)
        command.__signature__ = inspect.Signature(params, return_annotation=None)  # type: ignore[attr-defined]
        command.__annotations__ = {p.name: p.annotation for p in params} | {"return": None}
        app.command(name)(handle_errors(command))
        return fn

    return register


def print_json(data: Any) -> None:
    typer.echo(json.dumps(data, indent=2, sort_keys=False, default=str))


_ISO_TS = re.compile(r"^(\d{4}-\d\d-\d\d)T(\d\d:\d\d:\d\d)(?:\.\d+)?(Z|[+-]\d\d:?\d\d)?$")


def fmt(value: Any) -> str:
    """One table cell: None → "-", lists joined, dicts as compact JSON, timestamps to the second."""
    if isinstance(value, str) and (m := _ISO_TS.match(value)):
        zone = m.group(3) or ""
        return f"{m.group(1)} {m.group(2)}{'Z' if zone in ('Z', '+00:00', '+0000') else zone}"
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, list | tuple):
        if all(not isinstance(v, dict | list) for v in value):
            return ", ".join(str(v) for v in value) or "-"
        return json.dumps(value, separators=(",", ":"), default=str)
    if isinstance(value, dict):
        return json.dumps(value, separators=(",", ":"), default=str) if value else "-"
    return str(value)


def human_bytes(n: int | None) -> str:
    if n is None:
        return "-"
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{int(size)} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{n} B"


def print_record(record: dict[str, Any], *, title: str | None = None, skip: Iterable[str] = ()) -> None:
    """A key/value table of one record."""
    skipped = set(skip)
    table = Table(title=title, show_header=False, box=None, pad_edge=False)
    table.add_column("field", style="bold")
    table.add_column("value", overflow="fold")
    for key, value in record.items():
        if key not in skipped:
            table.add_row(key, fmt(value))
    out_console().print(table)


Column = tuple[str, Callable[[dict[str, Any]], Any]]


def print_rows(
    rows: Sequence[dict[str, Any]], columns: Sequence[Column], *, title: str | None = None
) -> None:
    """A table with one row per record; ``columns`` are (header, getter) pairs."""
    table = Table(title=title)
    for header, _ in columns:
        table.add_column(header, overflow="fold")
    for row in rows:
        table.add_row(*(fmt(get(row)) for _, get in columns))
    console = out_console()
    if rows:
        console.print(table)
    else:
        console.print(f"(no {title.lower() if title else 'rows'})")


def field(name: str) -> Callable[[dict[str, Any]], Any]:
    return lambda row: row.get(name)


def emit(
    opts: CliOptions,
    answer: Any,
    *,
    columns: Sequence[Column] | None = None,
    title: str | None = None,
    summary: str | None = None,
    skip: Iterable[str] = (),
) -> None:
    """Print an API answer: with ``--json`` the answer as it came; else the ``summary`` line (if
    any), then the rows as a table of ``columns``, or a record as a key/value table (a non-record
    answer prints nothing more)."""
    if opts.as_json:
        print_json(answer)
        return
    if summary:
        out_console().print(summary)
    if columns is not None:
        print_rows(answer, columns, title=title)
    elif isinstance(answer, dict):
        print_record(answer, title=title, skip=skip)


def normalise_version(version: str) -> str:
    """Accept ``3`` as well as ``v3``."""
    v = version.strip()
    return f"v{v}" if v.isdigit() else v


def parse_limit(value: str | None, name: str) -> tuple[bool, int | None]:
    """``--rpm 100`` → (True, 100); ``--rpm none`` → (True, None = unlimited); absent → (False, None)."""
    if value is None:
        return False, None
    if value.strip().lower() in {"none", "null", "unlimited"}:
        return True, None
    try:
        n = int(value)
    except ValueError:
        raise typer.BadParameter(f"{value!r} is not an integer or 'none'", param_hint=f"--{name}") from None
    if n < 0:
        raise typer.BadParameter("must be ≥ 0 (or 'none' for unlimited)", param_hint=f"--{name}")
    return True, n
