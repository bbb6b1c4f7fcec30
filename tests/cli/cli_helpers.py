"""Helpers of the CLI tests: a CliRunner over only the registry's command groups, and a
multipart parser to check what ``adapters push`` really sent."""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence
from typing import Any
from unittest import mock

import typer
import typer.main
from typer.testing import CliRunner, Result

from registry.cli import adapters_app, base_models_app, db_app, tenants_app


def registry_cli() -> typer.Typer:
    app = typer.Typer(add_completion=False, pretty_exceptions_enable=False)

    @app.callback()
    def _root() -> None:
        """test root"""

    app.add_typer(db_app, name="db")
    app.add_typer(adapters_app, name="adapters")
    app.add_typer(tenants_app, name="tenants")
    app.add_typer(base_models_app, name="base-models")
    return app


@functools.cache
def _command() -> Any:
    """The click command tree, built once (typer rebuilds it on every invoke otherwise)."""
    return typer.main.get_command(registry_cli())


def run_cli(args: Sequence[str], env: dict[str, str] | None = None) -> Result:
    """Run ``loraplane <args>`` in-process; stdout and stderr are kept apart."""
    base_env = {"COLUMNS": "250", "NO_COLOR": "1", "LORAPLANE_ADMIN_URL": "", "LORAPLANE_ADMIN_TOKEN": ""}
    base_env.update(env or {})
    runner = CliRunner()
    with mock.patch("typer.testing._get_command", lambda _app: _command()):
        return runner.invoke(registry_cli(), list(args), env=base_env, catch_exceptions=False)


def parse_multipart(body: bytes, content_type: str) -> list[tuple[str, str, bytes]]:
    """(field name, filename, content) for each part of a multipart/form-data body; the filename
    is "" for a text field (a part without one)."""
    m = re.search(r"boundary=([^;]+)", content_type)
    assert m, content_type
    boundary = m.group(1).encode()
    assert body.endswith(b"--" + boundary + b"--\r\n")
    parts = body.split(b"--" + boundary)
    out: list[tuple[str, str, bytes]] = []
    for part in parts[1:-1]:
        assert part.startswith(b"\r\n") and part.endswith(b"\r\n")
        head, _, content = part[2:-2].partition(b"\r\n\r\n")
        disp = re.search(rb'name="([^"]*)"(?:; filename="([^"]*)")?\r?(?:\n|$)', head)
        assert disp, head
        out.append((disp.group(1).decode(), (disp.group(2) or b"").decode(), content))
    return out
