"""``loraplane adapters limits`` and ``loraplane owners limits|show`` against a real admin API
(uvicorn on a free port, SQLite)."""

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

TOKEN = "limits-cli-admin-token"


@pytest.fixture(scope="module")
def admin_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    from registry.api import create_admin_app
    from registry.settings import RegistrySettings

    data = tmp_path_factory.mktemp("limits-cli")
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
            admin.create_adapter("support", bm["name"], owner="Payments EU")
            admin.create_adapter("billing", bm["name"], owner="Payments EU")
        yield url
    finally:
        server.should_exit = True
        thread.join(timeout=10)


def cli(url: str, *args: str) -> Any:
    from loraplane.cli import app

    env = {"LORAPLANE_ADMIN_URL": url, "LORAPLANE_ADMIN_TOKEN": TOKEN}
    return CliRunner().invoke(app, list(args), env=env, catch_exceptions=False)


def cli_json(url: str, *args: str) -> Any:
    res = cli(url, *args, "--json")
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)


def test_adapters_limits_sets_merges_and_clears(admin_url: str) -> None:
    rec = cli_json(admin_url, "adapters", "limits", "support", "--rpm", "120", "--max-concurrency", "4")
    assert rec["limits"] == {"rpm": 120, "tpm": None, "max_concurrency": 4}
    rec = cli_json(admin_url, "adapters", "limits", "support", "--tpm", "90000", "--rpm", "none")
    assert rec["limits"] == {"rpm": None, "tpm": 90000, "max_concurrency": 4}
    res = cli(admin_url, "adapters", "limits", "support")
    assert res.exit_code != 0 and "at least one" in res.output
    res = cli(admin_url, "adapters", "limits", "support", "--rpm", "-5")
    assert res.exit_code != 0
    table = cli(admin_url, "adapters", "limits", "support", "--max-concurrency", "2")
    assert table.exit_code == 0 and "updated limits of adapter support" in table.stdout
    assert "90000" in table.stdout and "unlimited" in table.stdout
    rec = cli_json(admin_url, "adapters", "limits", "support", "--clear")
    assert rec["limits"] == {"rpm": None, "tpm": None, "max_concurrency": None}
    res = cli(admin_url, "adapters", "limits", "nosuch", "--rpm", "1")
    assert res.exit_code != 0 and "adapter_not_found" in res.output


def test_owners_limits_merge_over_the_current_ones_and_show(admin_url: str) -> None:
    shown = cli_json(admin_url, "owners", "show", "Payments EU")
    assert shown["adapters"] == ["billing", "support"] and shown["limits"]["rpm"] is None
    rec = cli_json(admin_url, "owners", "limits", "Payments EU", "--rpm", "600", "--tpm", "100000")
    assert rec["limits"] == {"rpm": 600, "tpm": 100000, "max_concurrency": None}
    rec = cli_json(admin_url, "owners", "limits", "Payments EU", "--max-concurrency", "8")
    assert rec["limits"] == {"rpm": 600, "tpm": 100000, "max_concurrency": 8}  # the others kept
    table = cli(admin_url, "owners", "show", "Payments EU")
    assert table.exit_code == 0 and "billing, support" in table.stdout and "600" in table.stdout
    assert cli_json(admin_url, "owners", "limits", "Payments EU", "--clear")["limits"]["rpm"] is None
    # an owner with no adapters yet gets its limits too; an unknown one is an error
    assert cli_json(admin_url, "owners", "limits", "New Team", "--rpm", "5")["adapters"] == []
    res = cli(admin_url, "owners", "show", "nobody")
    assert res.exit_code != 0 and "owner_not_found" in res.output
