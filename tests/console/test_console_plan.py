"""The console's replicas page shows the placement plan (issue 28), over HTTP on a real SQLite
registry whose replica directory is the router's in-process one reading a plan made by
``make_plan`` from its board: per planned adapter its demand, planned replicas, the replicas it is
planned on (those not holding it yet marked) and where it is now; per pool the desired replicas.
No plan, or a directory that fails, is a line on the page — never a 500."""

from __future__ import annotations

import asyncio
import re
import time
from pathlib import Path
from typing import Any

import orjson
from fastapi.testclient import TestClient
from pydantic import SecretStr

from registry import migrate
from router.cluster import MemoryBoard
from router.directory import LocalReplicaDirectory
from tests.router.test_directory_plan import R0, R1, R2, _plan, _Source

TOKEN = "console-plan-admin-token-0123456789"
CONSOLE = "/admin/ui"


class _Broken:
    async def list_replicas(self) -> list[dict[str, Any]]:
        return []

    async def plan(self) -> dict[str, Any]:
        raise ConnectionError("redis is down")

    async def request_prewarm(self, adapter_id: str, version: str, replicas: int) -> dict[str, Any]:
        return {}


def _client(tmp_path: Path, directory: Any) -> TestClient:
    from registry.api import create_admin_app
    from registry.settings import RegistrySettings

    db_url = f"sqlite:///{tmp_path / 'registry.db'}"
    migrate.upgrade(db_url)
    settings = RegistrySettings(data_dir=tmp_path, database_url=db_url, admin_token=SecretStr(TOKEN))
    client = TestClient(create_admin_app(settings, replica_directory=directory))
    page = client.get(f"{CONSOLE}/signin")
    m = re.search(r'name="csrf" value="([^"]+)"', page.text)
    assert m is not None
    r = client.post(f"{CONSOLE}/signin", data={"csrf": m.group(1), "token": TOKEN}, follow_redirects=False)
    assert r.status_code == 303, r.text
    return client


def _plan_table(html: str) -> str:
    m = re.search(r'<table class="grid" id="plan">(.*?)</table>', html, re.S)
    assert m is not None, html
    return m.group(1)


def _row(table: str, lora_name: str) -> str:
    m = re.search(rf'<tr data-lora-name="{re.escape(lora_name)}">(.*?)</tr>', table, re.S)
    assert m is not None, table
    return m.group(1)


def test_replicas_page_shows_the_plan(tmp_path: Path) -> None:
    board = MemoryBoard()
    plan = _plan(time.time())
    asyncio.run(board.put_plan(orjson.dumps(plan.to_json()), 300.0))
    with _client(tmp_path, LocalReplicaDirectory(_Source(), board)) as client:
        r = client.get(f"{CONSOLE}/replicas")
        assert r.status_code == 200
        html = r.text
    summary = re.search(r'<p class="hint" id="plan-summary">(.*?)</p>', html, re.S)
    assert summary is not None
    assert f"<strong>p</strong> {plan.desired['p']}" in summary.group(1)
    table = _plan_table(html)
    assert table.index('data-lora-name="busy@v1"') < table.index('data-lora-name="calm@v1"')  # busiest first
    busy = _row(table, "busy@v1")
    cells = re.findall(r"<td>(.*?)</td>", busy, re.S)
    assert cells[0] == "v1" and cells[1] == "12.500" and cells[2] == "3"
    assert all(u in cells[3] for u in (R0, R1, R2))
    assert cells[3].count("not yet") == 2  # planned on r1 and r2, not loaded there yet
    assert R0 in cells[4] and '<span class="badge resident">resident</span>' in cells[4]
    assert R1 not in cells[4] and R2 not in cells[4]
    calm = _row(table, "calm@v1")
    assert "0.500" in calm and '<span class="badge loading">loading</span>' in calm
    assert f'href="{CONSOLE}/adapters/busy"' in busy


def test_replicas_page_without_a_plan_or_with_a_failing_directory(tmp_path: Path) -> None:
    with _client(tmp_path, LocalReplicaDirectory(_Source(), MemoryBoard())) as client:
        r = client.get(f"{CONSOLE}/replicas")
        assert r.status_code == 200 and 'id="plan-none"' in r.text and 'id="plan"' not in r.text
        assert 'id="replicas"' in r.text  # the replicas themselves still show
    (tmp_path / "broken").mkdir()
    with _client(tmp_path / "broken", _Broken()) as client:
        r = client.get(f"{CONSOLE}/replicas")
        assert r.status_code == 200
        assert "the placement plan is unavailable: ConnectionError" in r.text
