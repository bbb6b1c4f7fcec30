"""``GET /admin/v1/replicas/plan`` and ``loraplane replicas list|plan`` against a real admin API
(uvicorn on a free port, SQLite) whose replica directory is the router's in-process one
(``router.directory.LocalReplicaDirectory``) reading a plan made by ``make_plan`` from its board:
viewers may read it, 503 ``replicas_unavailable`` without a directory or when it fails, the CLI
prints the summary line and one row per planned adapter (``--json``: the answer as it came)."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import orjson
import pytest
import uvicorn
from pydantic import SecretStr
from typer.testing import CliRunner

from kit.procs import free_port, http_ready, wait_for
from registry import migrate
from router.cluster import MemoryBoard
from router.directory import LocalReplicaDirectory
from tests.router.test_directory_plan import R0, R1, R2, _plan, _Source

TOKEN = "plan-admin-token-0123456789abcdef"
V1 = "/admin/v1"


class _Broken:
    async def list_replicas(self) -> list[dict[str, Any]]:
        raise ConnectionError("redis is down")

    async def plan(self) -> dict[str, Any]:
        raise ConnectionError("redis is down")

    async def request_prewarm(self, adapter_id: str, version: str, replicas: int) -> dict[str, Any]:
        raise ConnectionError("redis is down")


def _serve(app: Any) -> tuple[str, uvicorn.Server, threading.Thread]:
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", ws="none", lifespan="on")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    wait_for(http_ready(f"{url}{V1}/healthz", timeout=5), 120)
    return url, server, thread


@pytest.fixture(scope="module")
def board() -> MemoryBoard:
    return MemoryBoard()


@pytest.fixture(scope="module")
def urls(tmp_path_factory: pytest.TempPathFactory, board: MemoryBoard) -> Iterator[dict[str, str]]:
    """Admin APIs on one database: with the router's directory (``board`` carries the plan), one
    whose board has no plan, with no directory, with a broken one."""
    from registry.api import create_admin_app
    from registry.settings import RegistrySettings

    data = tmp_path_factory.mktemp("plan-api")
    db_url = f"sqlite:///{data / 'registry.db'}"
    migrate.upgrade(db_url)
    settings = RegistrySettings(data_dir=data, database_url=db_url, admin_token=SecretStr(TOKEN))
    running = []
    try:
        out = {}
        for name, directory in (
            ("router", LocalReplicaDirectory(_Source(), board)),
            ("fresh", LocalReplicaDirectory(_Source(), MemoryBoard())),
            ("none", None),
            ("broken", _Broken()),
        ):
            url, server, thread = _serve(create_admin_app(settings, replica_directory=directory))
            running.append((server, thread))
            out[name] = url
        yield out
    finally:
        for server, thread in running:
            server.should_exit = True
            thread.join(timeout=10)


def _publish(board: MemoryBoard) -> None:
    asyncio.run(board.put_plan(orjson.dumps(_plan(time.time()).to_json()), 300.0))


def _auth(token: str = TOKEN) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def test_plan_route_serves_the_published_plan_to_viewers(urls: dict[str, str], board: MemoryBoard) -> None:
    url = urls["router"]
    r = httpx.post(f"{url}{V1}/principals", json={"id": "ops-viewer", "role": "viewer"}, headers=_auth())
    assert r.status_code == 201, r.text
    viewer = httpx.post(f"{url}{V1}/principals/ops-viewer/tokens", headers=_auth()).json()["token"]
    _publish(board)
    r = httpx.get(f"{url}{V1}/replicas/plan", headers=_auth(viewer))
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["published"] is True and body["desired_replicas"] == {"p": body["desired_replicas"]["p"]}
    busy = body["adapters"][0]
    assert (busy["adapter"], busy["demand_rps"], busy["planned_replicas"]) == ("busy", 12.5, 3)
    assert busy["targets"] == [R0, R1, R2] and busy["current"] == [{"url": R0, "state": "resident"}]
    assert httpx.get(f"{url}{V1}/replicas/plan").status_code == 401
    # the route is in the OpenAPI document with its response shape
    spec = httpx.get(f"{url}{V1}/openapi.json", headers=_auth()).json()
    assert "/admin/v1/replicas/plan" in spec["paths"] or "/replicas/plan" in json.dumps(spec["paths"])


def test_plan_route_is_503_without_a_working_directory(urls: dict[str, str]) -> None:
    for name in ("none", "broken"):
        r = httpx.get(f"{urls[name]}{V1}/replicas/plan", headers=_auth())
        assert r.status_code == 503, r.text
        assert r.json()["error"]["code"] == "replicas_unavailable"


def cli(url: str, *args: str) -> Any:
    from loraplane.cli import app

    env = {"LORAPLANE_ADMIN_URL": url, "LORAPLANE_ADMIN_TOKEN": TOKEN, "COLUMNS": "250", "NO_COLOR": "1"}
    return CliRunner().invoke(app, list(args), env=env, catch_exceptions=False)


def test_cli_replicas_plan_and_list(urls: dict[str, str], board: MemoryBoard) -> None:
    url = urls["router"]
    _publish(board)
    out = cli(url, "replicas", "plan")
    assert out.exit_code == 0, out.output
    lines = out.output.splitlines()
    assert lines[0].startswith("Plan of ") and "desired replicas: p=" in lines[0]
    assert lines[1] == "Planned adapters"
    assert lines[2].split()[:4] == ["adapter", "version", "demand", "rps"]
    busy = next(line for line in lines if line.startswith("busy "))
    assert busy.split()[:5] == ["busy", "v1", "12.500", "3", R0]
    assert f"{R0} (resident)" in busy
    assert any(line.startswith("calm ") and "0.500" in line for line in lines)
    as_json = cli(url, "replicas", "plan", "--json")
    assert as_json.exit_code == 0, as_json.output
    doc = json.loads(as_json.output)
    assert doc["published"] is True and [a["lora_name"] for a in doc["adapters"]] == ["busy@v1", "calm@v1"]
    listed = cli(url, "replicas", "list")
    assert listed.exit_code == 0, listed.output
    assert listed.output.splitlines()[0] == "Replicas"
    assert any(line.startswith(R0) and "busy@v1 (resident)" in line for line in listed.output.splitlines())
    assert json.loads(cli(url, "replicas", "list", "--json").output)[1]["url"] == R1


def test_cli_plan_says_when_none_is_published_and_fails_cleanly(urls: dict[str, str]) -> None:
    none = cli(urls["fresh"], "replicas", "plan")
    assert none.exit_code == 0, none.output
    assert none.output.startswith("No placement plan is published") and "Planned adapters" not in none.output
    assert json.loads(cli(urls["fresh"], "replicas", "plan", "--json").output)["published"] is False
    out = cli(urls["none"], "replicas", "plan")
    assert out.exit_code == 1 and "503 replicas_unavailable" in out.output
    empty = cli(urls["broken"], "replicas", "list")
    assert empty.exit_code == 1 and "replicas_unavailable" in empty.output
