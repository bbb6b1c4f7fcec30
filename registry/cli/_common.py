"""Shared plumbing of the registry CLI: global options, the admin client, error lines, output.

Every command group takes ``--url`` (env ``LORAPLANE_ADMIN_URL``), ``--token`` (env
``LORAPLANE_ADMIN_TOKEN``), ``--context`` (env ``LORAPLANE_CONTEXT``: credentials saved by
``loraplane login`` or ``loraplane up``), ``--json`` and ``--wide``, on the root (``loraplane
--context prod adapters list``), on the group (``loraplane adapters --json list``) and on each
command (``loraplane adapters list --json``); the innermost value wins. Which token goes to which
URL is :mod:`registry.cli.contexts`' business (a token is only sent to its own URL).

Commands are declared with :func:`admin_command`, which adds those options (after the command's
own) and hands the command the merged :class:`CliOptions`; :func:`emit` prints an answer as JSON
or as a table (:mod:`registry.cli.tables`: ids never cut, descriptions cut to the screen,
everything whole through a pipe or with ``--wide``).

Errors never show a traceback: an API error prints ``error: STATUS CODE: MESSAGE`` (plus one
line per problem of an ``invalid_adapter`` answer, and for a 401 how to log in) on stderr and
exits 1; an unreachable admin API prints ``error: cannot reach the admin API at URL (is it
running?)`` and exits 2.
"""

from __future__ import annotations

import functools
import inspect
import json
import re
from collections.abc import Callable, Iterable, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Annotated, Any, ParamSpec, TypeVar

import typer
from rich.console import Console

from registry.admin_client import AdminAPIError, AdminClient, AdminUnreachable
from registry.cli.contexts import ContextError, Credentials, resolve
from registry.cli.tables import WIDE, Col, Getter, render_record, render_rows, width_limit

P = ParamSpec("P")
R = TypeVar("R")

EXIT_API_ERROR = 1
EXIT_UNREACHABLE = 2

UrlOpt = Annotated[
    str | None,
    typer.Option(
        "--url", help="Admin API base URL (env LORAPLANE_ADMIN_URL; default http://127.0.0.1:8081)."
    ),
]
TokenOpt = Annotated[
    str | None, typer.Option("--token", help="Admin bearer token (env LORAPLANE_ADMIN_TOKEN).")
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print the raw JSON answer instead of tables.")]
ContextOpt = Annotated[
    str | None,
    typer.Option(
        "--context",
        help="Credentials saved by `loraplane login --context NAME` (or `up`: 'local') "
        "(env LORAPLANE_CONTEXT).",
    ),
]
WideOpt = Annotated[
    bool, typer.Option("--wide", help="Tables: never cut or leave out a column, whatever the width.")
]


@dataclass
class CliOptions:
    url: str | None = None
    token: str | None = None
    as_json: bool = False
    context: str | None = None
    wide: bool = False


def inherited(ctx: typer.Context) -> CliOptions:
    """The options given on the enclosing commands (the root's ``loraplane --context NAME …``, the
    group's)."""
    return ctx.obj if isinstance(ctx.obj, CliOptions) else CliOptions()


def group_callback(
    ctx: typer.Context,
    url: UrlOpt = None,
    token: TokenOpt = None,
    as_json: JsonOpt = False,
    context: ContextOpt = None,
    wide: WideOpt = False,
) -> None:
    """Options shared by every command of the group."""
    ctx.obj = merge(inherited(ctx), CliOptions(url, token, as_json, context, wide))


def merge(base: CliOptions, over: CliOptions) -> CliOptions:
    """``over``'s values where given, else ``base``'s."""
    return CliOptions(
        url=over.url or base.url,
        token=over.token or base.token,
        as_json=over.as_json or base.as_json,
        context=over.context or base.context,
        wide=over.wide or base.wide,
    )


def new_group(help_text: str) -> typer.Typer:
    app = typer.Typer(
        help=help_text, no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False
    )
    app.callback()(group_callback)
    return app


def options(
    ctx: typer.Context,
    url: str | None,
    token: str | None,
    as_json: bool,
    context: str | None = None,
    wide: bool = False,
) -> CliOptions:
    """Merge a command's own options over the group's and the root's (env vars: see
    :func:`registry.cli.contexts.resolve`)."""
    return merge(inherited(ctx), CliOptions(url, token, as_json, context, wide))


# the credentials of the command being run, for the hint of a 401 (see handle_errors)
_USED: ContextVar[Credentials | None] = ContextVar("loraplane_cli_credentials", default=None)


def credentials(opts: CliOptions) -> Credentials:
    """Flags and env first, then the named context, the one saved for the URL, the current one, a
    local ``loraplane up`` (:func:`registry.cli.contexts.resolve`)."""
    try:
        creds = resolve(opts.url, opts.token, opts.context)
    except ContextError as exc:
        raise fail(str(exc)) from None
    _USED.set(creds)
    return creds


def client(opts: CliOptions) -> AdminClient:
    creds = credentials(opts)
    return AdminClient(creds.url, creds.token)


def login_hint(creds: Credentials | None) -> str:
    """How to get past a 401, given the credentials that were sent."""
    url = creds.url if creds is not None else "URL"
    login = f"loraplane login --url {url} --token lpa-… --context NAME"
    if creds is None or creds.token is None:
        return (
            f"hint: no admin token was found for {url}. Log in once with `{login}` (or pass --token / "
            "LORAPLANE_ADMIN_TOKEN); `loraplane up` saves the context 'local' for you."
        )
    if creds.source == "flags":
        return f"hint: {url} refused the token given by --token / LORAPLANE_ADMIN_TOKEN."
    return (
        f"hint: {url} refused the token of {creds.source} (revoked, or from another platform's data): "
        f"log in again with `{login}`."
    )


def err_console() -> Console:
    return Console(stderr=True, highlight=False, soft_wrap=True)


def out_console() -> Console:
    """Summary lines on stdout: never wrapped by rich (a pipe or a narrow terminal gets the whole
    line; the terminal wraps it, not a newline in the output)."""
    return Console(highlight=False, soft_wrap=True)


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
            if exc.status == 401:
                lines.append(login_hint(_USED.get()))
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
    inspect.Parameter("wide", inspect.Parameter.KEYWORD_ONLY, annotation=WideOpt, default=False),
]


def admin_command(app: typer.Typer, name: str) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """Register ``fn(opts, **own_params)`` as command NAME of APP, a client of the admin API.

    The command typer sees takes the context, ``fn``'s parameters after the first (its arguments
    and options, in order), then ``--url``, ``--token``, ``--json``, ``--context`` and ``--wide``;
    ``fn`` gets those merged over the group's and the root's (:func:`options`) as its first
    argument. Errors go through :func:`handle_errors`.
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
            wide: bool,
            **kwargs: Any,
        ) -> None:
            opts = options(ctx, url, token, as_json, context, wide)
            WIDE.set(opts.wide)
            fn(opts, **kwargs)

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
    """One record as ``field  value`` lines, every value whole."""
    lines = ([title] if title else []) + render_record(record, fmt, skip)
    typer.echo("\n".join(lines))


Column = Col | tuple[str, Getter]


def print_rows(
    rows: Sequence[dict[str, Any]], columns: Sequence[Column], *, title: str | None = None
) -> None:
    """A table with one row per record; ``columns`` are (header, getter) pairs (key columns) or
    :class:`~registry.cli.tables.Col` (``text(…)``/``extra(…)`` columns may be cut or left out to
    fit the screen)."""
    if not rows:
        typer.echo(f"(no {title.lower() if title else 'rows'})")
        return
    lines = ([title] if title else []) + render_rows(rows, columns, fmt, width_limit())
    typer.echo("\n".join(lines))


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
