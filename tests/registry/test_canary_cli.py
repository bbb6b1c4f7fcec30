"""``loraplane adapters canary-policy`` against a real admin API (uvicorn on a free port, SQLite):
set with defaults filled in, show, refuse a bad value with the API's problems, clear."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from typing import Any

import pytest
import uvicorn
from pydantic import SecretStr
from typer.testing import CliRunner

from kit.procs import free_port, http_ready, wait_for
from registry import migrate
from registry.admin_client import AdminClient
from registry.demo import demo_base_model

TOKEN = "canary-cli-admin-token"


@pytest.fixture(scope="module")
def admin_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    from registry.api import create_admin_app
    from registry.settings import RegistrySettings

    data = tmp_path_factory.mktemp("canary-cli")
    db_url = f"sqlite:///{data / 'registry.db'}"
    migrate.upgrade(db_url)
    app = create_admin_app(RegistrySettings(data_dir=data, database_url=db_url, admin_token=SecretStr(TOKEN)))
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", ws="none", lifespan="on")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for(http_ready(f"{url}/admin/v1/healthz", timeout=5), 120)
        with AdminClient(url, TOKEN) as admin:
            bm = demo_base_model()
            admin.create_base_model(
                bm["name"], bm["hf_id"], bm["max_lora_rank"], bm["target_modules"], bm["module_shapes"]
            )
            admin.create_adapter("support", bm["name"], owner="team-a")
        yield url
    finally:
        server.should_exit = True
        thread.join(timeout=10)


def cli(url: str, *args: str) -> Any:
    from loraplane.cli import app

    env = {"LORAPLANE_ADMIN_URL": url, "LORAPLANE_ADMIN_TOKEN": TOKEN, "COLUMNS": "250", "NO_COLOR": "1"}
    return CliRunner().invoke(app, list(args), env=env, catch_exceptions=False)


def test_canary_policy_set_show_refuse_clear(admin_url: str) -> None:
    r = cli(admin_url, "adapters", "canary-policy", "support")
    assert r.exit_code == 0 and "none (canaries run unwatched)" in r.stdout
    r = cli(
        admin_url,
        "adapters",
        "canary-policy",
        "support",
        "--min-requests",
        "50",
        "--auto-promote-after-s",
        "600",
    )
    assert r.exit_code == 0, r.output
    assert "min_requests" in r.stdout and "50" in r.stdout
    r = cli(admin_url, "adapters", "canary-policy", "support", "--json")
    got = json.loads(r.stdout)["canary_policy"]
    assert got["min_requests"] == 50 and got["auto_promote_after_s"] == 600.0 and got["window_s"] == 600.0
    r = cli(admin_url, "adapters", "canary-policy", "support", "--max-ttft-p99-ratio", "0.5")
    assert r.exit_code != 0 and "max_ttft_p99_ratio must be a number from 1 to 1000" in r.output
    assert (
        json.loads(cli(admin_url, "adapters", "canary-policy", "support", "--json").stdout)["canary_policy"]
        == got
    )
    r = cli(admin_url, "adapters", "canary-policy", "support", "--clear")
    assert r.exit_code == 0 and "none" in r.stdout
    with AdminClient(admin_url, TOKEN) as admin:
        assert admin.get_adapter("support")["canary_policy"] is None
