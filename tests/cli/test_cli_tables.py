"""Tables at 80 columns and through a pipe (issue 25.5): ids and version names are never cut or
wrapped, descriptions are cut with … to fit, `--wide` and pipes show every value whole, `--json`
is unchanged. Rendered by the real CLI against a recorded admin API answer (the same against a
real `up` in test_cli_up_day)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

import registry.cli._common as common
from registry.admin_client import AdminClient
from registry.cli.tables import Col, extra, layout, render_rows, text
from tests.cli.cli_helpers import run_cli

IDS = ["demo-support-assistant-eu-west-2", "demo-sql", "payments-fraud-classifier-v2024"]
ADAPTERS = [
    {
        "id": aid,
        "base_model": "qwen3-8b-instruct",
        "owner": "team-customer-experience",
        "description": "Friendly support assistant trained on three years of tickets, " * 2,
        "status": "active",
        "active_version": "v12",
        "canary_version": "v13" if i == 0 else None,
        "canary_weight": 10 if i == 0 else None,
        "hot": i == 1,
        "created_at": "2026-11-29T08:00:00Z",
    }
    for i, aid in enumerate(IDS)
]


@pytest.fixture
def api(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json={"data": ADAPTERS, "next_cursor": None})

    def _client(url: str, token: str | None = None, **kw: Any) -> AdminClient:
        return AdminClient(url, token, transport=httpx.MockTransport(handler))

    monkeypatch.setattr(common, "AdminClient", _client)
    yield


def _lines(out: str) -> list[str]:
    return [ln for ln in out.splitlines() if ln.strip()]


def test_80_columns_keeps_ids_whole_and_cuts_descriptions(api: None) -> None:
    res = run_cli(["adapters", "list", "--token", "t"], env={"COLUMNS": "80"})
    assert res.exit_code == 0, res.output
    lines = _lines(res.stdout)
    assert all(len(ln) <= 80 for ln in lines), "\n".join(lines)
    assert lines[0] == "Adapters"
    for aid, ln in zip(IDS, lines[2:], strict=True):
        assert ln.split()[0] == aid  # whole, on its row's one line
        assert "v12" in ln.split() and "active" in ln.split()
    assert "v13 (10%)" in lines[2]
    assert lines[1].split() == ["id", "status", "active", "canary", "hot", "description"]  # --wide: all
    assert "…" in lines[2] and "three years of tickets" not in res.stdout  # the description cut


def test_a_pipe_and_wide_show_every_value_whole(api: None) -> None:
    for env, args in (({}, []), ({"COLUMNS": "80"}, ["--wide"])):
        res = run_cli(["adapters", "list", "--token", "t", *args], env={"COLUMNS": "", **env})
        assert res.exit_code == 0, res.output
        lines = _lines(res.stdout)
        assert len(lines) == 2 + len(IDS)  # title, header, one line per adapter
        assert "created" in lines[1] and "2026-11-29 08:00:00Z" in lines[2]
        assert str(ADAPTERS[0]["description"]).strip() in lines[2] and "…" not in res.stdout


def test_json_is_unchanged(api: None) -> None:
    res = run_cli(["adapters", "list", "--token", "t", "--json"], env={"COLUMNS": "40"})
    assert json.loads(res.stdout) == ADAPTERS


def test_layout_rules() -> None:
    cols = [
        Col("id", lambda r: r["id"]),
        text("description", lambda r: r["d"]),
        extra("created", lambda r: 0),
    ]
    cells = [["a-very-long-adapter-identifier", "x" * 60, "2026-11-29 08:00:00Z"]]
    assert layout(cols, cells, None) == [30, 60, 20]
    assert layout(cols, cells, 80) == [30, 26, 20]  # the text cut first
    assert layout(cols, cells, 60) == [30, 28, None]  # then the extra column left out
    assert layout(cols, cells, 43) == [30, 11, None]  # then the text cut to its floor
    assert layout(cols, cells, 40) == [30, None, None]  # then left out
    assert layout(cols, cells, 20) == [30, None, None]  # keys stay whole even past the width
    rows = [{"id": "a", "d": "one\ntwo"}]
    assert render_rows(rows, [Col("id", lambda r: r["id"]), Col("d", lambda r: r["d"])], str, None) == [
        "id  d",
        "a   one",
        "    two",
    ]
