"""``loraplane db upgrade|current``: apply or inspect the schema migrations (Alembic).

The database is ``--database-url``, else ``LORAPLANE_DATABASE_URL``, else the embedded SQLite
file under ``LORAPLANE_DATA_DIR`` (see :class:`registry.settings.RegistrySettings`).
"""

from __future__ import annotations

from typing import Annotated, Any

import typer

db_app = typer.Typer(
    help="Database schema: apply migrations, show the current revision.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

DbUrlOpt = Annotated[
    str | None,
    typer.Option(
        "--database-url", help="SQLAlchemy URL (env LORAPLANE_DATABASE_URL; default SQLite in the data dir)."
    ),
]


def _url(explicit: str | None) -> str:
    if explicit:
        return explicit
    from registry.settings import RegistrySettings

    settings = RegistrySettings()
    if not settings.database_url:
        settings.data_dir.mkdir(parents=True, exist_ok=True)
    return settings.resolved_database_url()


def _shown(url: str) -> str:
    """The URL without its password."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        return make_url(url).render_as_string(hide_password=True)
    except ArgumentError:
        return "<unparseable database url>"


def _run(action: str, url: str, fn: Any) -> Any:
    """Call ``fn`` and turn database/migration errors into one line + exit 1."""
    from alembic.util import CommandError
    from sqlalchemy.exc import ArgumentError, SQLAlchemyError

    try:
        return fn()
    except (SQLAlchemyError, CommandError, ArgumentError, OSError) as exc:
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        typer.echo(f"error: {action} failed on {_shown(url)}: {reason}", err=True)
        raise typer.Exit(1) from None


@db_app.command("upgrade")
def upgrade(database_url: DbUrlOpt = None) -> None:
    """Apply every pending migration (idempotent)."""
    from registry import migrate

    url = _url(database_url)
    _run("upgrade", url, lambda: migrate.upgrade(url))
    rev = _run("reading the revision", url, lambda: migrate.current(url))
    typer.echo(f"database {_shown(url)} is at revision {rev} (head)")


@db_app.command("current")
def current(database_url: DbUrlOpt = None) -> None:
    """Show the schema revision of the database, and whether it is up to date."""
    from registry import migrate

    url = _url(database_url)
    rev = _run("reading the revision", url, lambda: migrate.current(url))
    head = migrate.head()
    if rev is None:
        typer.echo(f"database {_shown(url)} has no schema yet; run `loraplane db upgrade`")
        raise typer.Exit(1)
    if rev != head:
        typer.echo(f"database {_shown(url)} is at revision {rev}; head is {head}: run `loraplane db upgrade`")
        raise typer.Exit(1)
    typer.echo(f"database {_shown(url)} is at revision {rev} (head)")
