"""End-to-end: the CLI against a real admin API (uvicorn on a free port, SQLite + local artifacts)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import uvicorn
from pydantic import SecretStr

from kit.procs import free_port, http_ready, wait_for
from registry import migrate
from registry.adapter_factory import write_adapter
from registry.demo import demo_base_model
from tests.cli.cli_helpers import run_cli

TOKEN = "cli-e2e-admin-token"

# one admin server per session: keep these tests on one xdist worker (--dist loadgroup)
pytestmark = pytest.mark.xdist_group("cli-e2e")


@pytest.fixture(scope="session")
def admin_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    from registry.api import create_admin_app
    from registry.settings import RegistrySettings

    data = tmp_path_factory.mktemp("registry")
    db_url = f"sqlite:///{data / 'registry.db'}"
    migrate.upgrade(db_url)
    settings = RegistrySettings(data_dir=data, database_url=db_url, admin_token=SecretStr(TOKEN))
    app = create_admin_app(settings)
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", ws="none", lifespan="on")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for(http_ready(f"{url}/admin/v1/healthz", timeout=5), 120)  # CI machines can be very loaded
        yield url
    finally:
        server.should_exit = True
        thread.join(timeout=10)


def cli(admin_url: str, *args: str, token: str = TOKEN) -> Any:
    return run_cli(list(args), env={"LORAPLANE_ADMIN_URL": admin_url, "LORAPLANE_ADMIN_TOKEN": token})


def cli_json(admin_url: str, *args: str) -> Any:
    res = cli(admin_url, *args, "--json")
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)


@pytest.fixture(scope="session")
def base_model(admin_url: str) -> str:
    bm = demo_base_model()
    modules, shapes = ",".join(bm["target_modules"]), json.dumps(bm["module_shapes"])
    res = cli(
        admin_url, "base-models", "add", bm["name"], "--hf-id", bm["hf_id"], "--max-lora-rank", "64",
        "--target-modules", modules, "--module-shapes", shapes,
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    return str(bm["name"])


def test_base_models_add_list_show(admin_url: str, base_model: str) -> None:
    rows = cli_json(admin_url, "base-models", "list")
    assert [r["name"] for r in rows] == [base_model]
    shown = cli_json(admin_url, "base-models", "show", base_model)
    assert shown["max_lora_rank"] == 64 and shown["module_shapes"]["down_proj"] == [512, 256]
    res = cli(admin_url, "base-models", "list")
    assert base_model in res.stdout and "loraplane/demo-base" in res.stdout
    # a second add of the same name is an API error line, exit 1
    res = cli(admin_url, "base-models", "add", base_model, "--hf-id", "x/y", "--max-lora-rank", "8",
              "--target-modules", "q_proj")  # fmt: skip
    assert res.exit_code == 1
    assert res.stderr.startswith("error: 409 ")


def test_adapter_lifecycle(admin_url: str, base_model: str, tmp_path: Path) -> None:
    v1_dir = write_adapter(tmp_path / "v1", rank=8, seed=1)
    v2_dir = write_adapter(tmp_path / "v2", rank=16, seed=2, target_modules=("q_proj", "k_proj", "v_proj"))

    res = cli(admin_url, "adapters", "push", str(v1_dir), "--adapter", "support-bot", "--base", base_model,
              "--owner", "ml-team", "--description", "support answers")  # fmt: skip
    assert res.exit_code == 0, res.output
    assert "uploaded support-bot v1" in res.stdout
    assert "adapter_model.safetensors" in res.stdout  # files table with hashes

    pushed = cli(admin_url, "adapters", "push", str(v2_dir), "-a", "support-bot", "--json")
    assert pushed.exit_code == 0, pushed.output
    v2 = json.loads(pushed.stdout)
    assert v2["version"] == "v2" and v2["rank"] == 16
    import hashlib

    by_name = {f["name"]: f for f in v2["files"]}
    weights = (v2_dir / "adapter_model.safetensors").read_bytes()
    assert by_name["adapter_model.safetensors"]["sha256"] == hashlib.sha256(weights).hexdigest()
    assert by_name["adapter_model.safetensors"]["size"] == len(weights)

    listed = cli_json(admin_url, "adapters", "list", "--base-model", base_model)
    assert "support-bot" in [a["id"] for a in listed]
    assert cli_json(admin_url, "adapters", "list", "--owner", "nobody") == []

    res = cli(admin_url, "adapters", "show", "support-bot")
    assert res.exit_code == 0, res.output
    assert "Versions" in res.stdout and "v1" in res.stdout and "v2" in res.stdout

    state = cli_json(admin_url, "adapters", "promote", "support-bot", "v1")
    assert state["active_version"] == "v1"
    res = cli(admin_url, "adapters", "promote", "support-bot", "2", "--canary", "10")
    assert res.exit_code == 0, res.output
    assert "support-bot v2 is now canary at 10%" in res.stdout
    state = cli_json(admin_url, "adapters", "show", "support-bot")
    assert (state["active_version"], state["canary_version"], state["canary_weight"]) == ("v1", "v2", 10)

    state = cli_json(admin_url, "adapters", "promote", "support-bot", "v2")
    assert (state["active_version"], state["canary_version"]) == ("v2", None)
    version = cli_json(admin_url, "adapters", "versions", "support-bot", "v2")
    assert version["rollback_to"] == "v1"

    res = cli(admin_url, "adapters", "rollback", "support-bot")
    assert res.exit_code == 0, res.output
    assert "active version: v1" in res.stdout
    res = cli(admin_url, "adapters", "rollback", "support-bot")
    assert res.exit_code == 1
    assert res.stderr.startswith("error: 409 no_rollback_target: ")
    assert len(res.stderr.strip().splitlines()) == 1 and "Traceback" not in res.output

    assert cli_json(admin_url, "adapters", "disable", "support-bot")["status"] == "disabled"
    assert cli_json(admin_url, "adapters", "list", "--status", "disabled")[0]["id"] == "support-bot"
    state = cli_json(admin_url, "adapters", "enable", "support-bot")
    assert (state["status"], state["active_version"]) == ("active", "v1")

    state = cli_json(admin_url, "adapters", "disable-version", "support-bot", "v2")
    statuses = {v["version"]: v["status"] for v in state.get("versions") or []}
    if statuses:
        assert statuses["v2"] == "disabled"
    res = cli(admin_url, "adapters", "promote", "support-bot", "v2")
    assert res.exit_code == 1 and res.stderr.startswith("error: ")

    events = cli_json(admin_url, "adapters", "audit", "--subject-id", "support-bot", "--limit", "100")
    actions = {e["action"] for e in events}
    expected = {
        "adapter.created", "version.uploaded", "version.promoted", "version.canary",
        "adapter.rolled_back", "adapter.disabled", "adapter.enabled", "version.disabled",
    }  # fmt: skip
    assert expected <= actions
    promoted = cli_json(admin_url, "adapters", "audit", "--action", "version.promoted")
    assert promoted and all(e["action"] == "version.promoted" for e in promoted)
    res = cli(admin_url, "adapters", "audit", "--subject-id", "support-bot")
    assert res.exit_code == 0 and "adapter.rolled_back" in res.stdout


def test_adapter_create_and_update_hot(admin_url: str, base_model: str) -> None:
    created = cli_json(admin_url, "adapters", "create", "hot-bot", "--base", base_model, "--owner", "ml")
    assert (created["id"], created["hot"], created["owner"]) == ("hot-bot", False, "ml")
    res = cli(admin_url, "adapters", "update", "hot-bot", "--hot")
    assert res.exit_code == 0, res.output
    assert "updated hot-bot: marked hot" in res.stdout
    shown = cli_json(admin_url, "adapters", "show", "hot-bot")
    assert shown["hot"] is True and shown["owner"] == "ml"
    listed = {a["id"]: a for a in cli_json(admin_url, "adapters", "list")}
    assert listed["hot-bot"]["hot"] is True
    res = cli(admin_url, "adapters", "list")
    assert res.exit_code == 0 and "hot" in res.stdout
    state = cli_json(admin_url, "adapters", "update", "hot-bot", "--no-hot", "--description", "faq answers")
    assert (state["hot"], state["description"]) == (False, "faq answers")
    events = cli_json(
        admin_url, "adapters", "audit", "--action", "adapter.updated", "--subject-id", "hot-bot"
    )
    # newest first (the CLI's default), and --oldest-first
    assert [e["details"] for e in events] == [{"description": "faq answers", "hot": False}, {"hot": True}]
    events = cli_json(
        admin_url,
        "adapters",
        "audit",
        "--action",
        "adapter.updated",
        "--subject-id",
        "hot-bot",
        "--oldest-first",
    )
    assert [e["details"] for e in events] == [{"hot": True}, {"description": "faq answers", "hot": False}]
    warm = cli_json(admin_url, "adapters", "create", "warm-bot", "--base", base_model, "--hot")
    assert warm["hot"] is True
    res = cli(admin_url, "adapters", "update", "no-such-bot", "--hot")
    assert res.exit_code == 1 and res.stderr.startswith("error: 404 adapter_not_found: ")


def test_adapter_create_and_update_on_load_failure(admin_url: str, base_model: str) -> None:
    created = cli_json(
        admin_url, "adapters", "create", "olf-bot", "--base", base_model, "--on-load-failure", "base_model"
    )
    assert created["on_load_failure"] == "base_model"
    plain = cli_json(admin_url, "adapters", "create", "olf-plain", "--base", base_model)
    assert plain["on_load_failure"] == "error"  # not given: the server's default
    res = cli(admin_url, "adapters", "update", "olf-bot", "--on-load-failure", "previous_version")
    assert res.exit_code == 0, res.output
    assert "updated olf-bot: on_load_failure previous_version" in res.stdout
    shown = cli_json(admin_url, "adapters", "show", "olf-bot")
    assert (shown["on_load_failure"], shown["hot"]) == ("previous_version", False)
    events = cli_json(
        admin_url, "adapters", "audit", "--action", "adapter.updated", "--subject-id", "olf-bot"
    )
    assert [e["details"] for e in events] == [{"on_load_failure": "previous_version"}]
    res = cli(admin_url, "adapters", "update", "olf-bot", "--on-load-failure", "retry")
    assert res.exit_code == 2  # not one of the three: refused before any request
    assert cli_json(admin_url, "adapters", "show", "olf-bot")["on_load_failure"] == "previous_version"


def test_invalid_adapter_push_lists_problems(admin_url: str, base_model: str, tmp_path: Path) -> None:
    bad = write_adapter(tmp_path / "bad", rank=128, config_overrides={"use_dora": True})
    res = cli(admin_url, "adapters", "push", str(bad), "-a", "bad-bot", "--base", base_model)
    assert res.exit_code == 1
    lines = res.stderr.strip().splitlines()
    assert any(line.startswith("error: 422 invalid_adapter: ") for line in lines)
    problems = [line for line in lines if line.startswith("  - ")]
    assert len(problems) >= 2
    assert any("use_dora" in p for p in problems) and any("128" in p for p in problems)
    assert cli_json(admin_url, "adapters", "versions", "bad-bot") == []


def test_tenants(admin_url: str, base_model: str, tmp_path: Path) -> None:
    cli(
        admin_url,
        "adapters",
        "push",
        str(write_adapter(tmp_path / "a")),
        "-a",
        "sql-bot",
        "--base",
        base_model,
    )
    res = cli(
        admin_url, "tenants", "create", "acme", "--name", "Acme Corp", "--rpm", "60", "--max-concurrency", "4"
    )
    assert res.exit_code == 0, res.output
    tenant = cli_json(admin_url, "tenants", "show", "acme")
    assert tenant["name"] == "Acme Corp"
    assert tenant["limits"] == {"rpm": 60, "tpm": None, "max_concurrency": 4, "max_cold_waiters": None}
    assert tenant["base_model_access"] is False

    res = cli(admin_url, "tenants", "key", "acme")
    assert res.exit_code == 0, res.output
    key = res.stdout.strip().splitlines()[-1]
    assert len(key) >= 20 and "shown only now" in res.stderr
    issued = cli_json(admin_url, "tenants", "key", "acme")
    assert issued["key"] != key and issued["key"].startswith(issued["prefix"])

    grant = cli_json(admin_url, "tenants", "grant", "acme", "sql-bot", "--rpm", "10")
    assert grant == {"tenant_id": "acme", "adapter_id": "sql-bot", "rpm": 10, "tpm": None}

    tenant = cli_json(admin_url, "tenants", "limits", "acme", "--rpm", "none", "--tpm", "1000",
                      "--base-model-access")  # fmt: skip
    assert tenant["limits"] == {"rpm": None, "tpm": 1000, "max_concurrency": 4, "max_cold_waiters": None}
    assert tenant["base_model_access"] is True

    detail = cli_json(admin_url, "tenants", "show", "acme")
    assert [g["adapter_id"] for g in detail["grants"]] == ["sql-bot"]
    assert len(detail["keys"]) == 2 and all("key" not in k for k in detail["keys"])
    res = cli(admin_url, "tenants", "revoke", "acme", issued["key_id"])
    assert res.exit_code == 0, res.output
    keys = {k["key_id"]: k for k in cli_json(admin_url, "tenants", "show", "acme")["keys"]}
    assert keys[issued["key_id"]]["revoked_at"] is not None

    res = cli(admin_url, "tenants", "show", "acme")
    assert (
        res.exit_code == 0
        and "Grants" in res.stdout
        and "sql-bot" in res.stdout
        and "unlimited" in res.stdout
    )
    assert "acme" in [t["id"] for t in cli_json(admin_url, "tenants", "list")]

    assert cli(admin_url, "tenants", "ungrant", "acme", "sql-bot").exit_code == 0
    assert cli_json(admin_url, "tenants", "show", "acme")["grants"] == []
    events = cli_json(admin_url, "adapters", "audit", "--subject-id", "acme", "--limit", "50")
    assert {
        "tenant.created",
        "key.issued",
        "key.revoked",
        "grant.added",
        "grant.removed",
        "tenant.updated",
    } <= {e["action"] for e in events}


def test_auth_and_unreachable(admin_url: str, base_model: str) -> None:
    res = cli(admin_url, "adapters", "list", token="wrong-token")
    assert res.exit_code == 1
    assert res.stderr.startswith("error: 401 ")
    res = cli(admin_url, "adapters", "show", "no-such-adapter")
    assert res.exit_code == 1 and res.stderr.startswith("error: 404 ")
    # no replica directory is wired into this app: a clean 503 line
    res = cli(admin_url, "adapters", "replicas")
    assert res.exit_code == 1 and res.stderr.startswith("error: 503 ")
    dead = f"http://127.0.0.1:{free_port()}"
    res = run_cli(["base-models", "list", "--url", dead, "--token", TOKEN])
    assert res.exit_code == 2
    assert res.stderr.strip() == f"error: cannot reach the admin API at {dead} (is it running?)"


def test_quality_gate_blocks_promotion_until_passed_or_forced(
    admin_url: str, base_model: str, tmp_path: Path
) -> None:
    d = write_adapter(tmp_path / "a", rank=8, seed=3)
    v1 = cli_json(admin_url, "adapters", "push", str(d), "-a", "gated-bot", "--base", base_model)
    assert (v1["version"], v1["quality_gate"]) == ("v1", "skipped")
    assert cli_json(admin_url, "adapters", "promote", "gated-bot", "v1")["active_version"] == "v1"
    v2 = cli_json(admin_url, "adapters", "push", str(d), "-a", "gated-bot", "--quality-gate", "pending")
    assert (v2["version"], v2["quality_gate"]) == ("v2", "pending")

    # pending blocks promotion, as canary too; nothing changes
    for extra in ([], ["--canary", "10"]):
        res = cli(admin_url, "adapters", "promote", "gated-bot", "v2", *extra)
        assert res.exit_code == 1
        assert res.stderr.startswith("error: 409 quality_gate_pending: ")
        assert len(res.stderr.strip().splitlines()) == 1
    state = cli_json(admin_url, "adapters", "show", "gated-bot")
    assert (state["active_version"], state["canary_version"]) == ("v1", None)

    # a failing eval: still blocked, with its own code
    res = cli(
        admin_url, "adapters", "gate", "gated-bot", "v2", "--status", "failed", "--details", '{"acc": 0.2}'
    )
    assert res.exit_code == 0, res.output
    assert "gated-bot v2 quality gate: failed" in res.stdout
    res = cli(admin_url, "adapters", "promote", "gated-bot", "2")
    assert res.exit_code == 1 and res.stderr.startswith("error: 409 quality_gate_failed: ")

    # a passing eval unblocks it
    report = tmp_path / "eval.json"
    report.write_text(json.dumps({"acc": 0.93, "run": "ci-42"}))
    gated = cli_json(
        admin_url, "adapters", "gate", "gated-bot", "v2", "--status", "passed", "--details", f"@{report}"
    )
    assert (gated["quality_gate"], gated["quality_gate_details"]) == ("passed", {"acc": 0.93, "run": "ci-42"})
    assert cli_json(admin_url, "adapters", "promote", "gated-bot", "v2")["active_version"] == "v2"

    # --force overrides a pending gate, and the audit log says so
    v3 = cli_json(admin_url, "adapters", "push", str(d), "-a", "gated-bot", "--quality-gate", "pending")
    state = cli_json(admin_url, "adapters", "promote", "gated-bot", v3["version"], "--force")
    assert state["active_version"] == "v3"
    promoted = cli_json(
        admin_url,
        "adapters",
        "audit",
        "--action",
        "version.promoted",
        "--subject-id",
        "gated-bot",
        "--oldest-first",
    )
    assert [e["details"].get("forced_quality_gate") for e in promoted] == [None, None, "pending"]
    gate_events = cli_json(
        admin_url, "adapters", "audit", "--action", "version.quality_gate", "--subject-id", "gated-bot",
        "--oldest-first",
    )  # fmt: skip
    assert [(e["details"]["from"], e["details"]["to"]) for e in gate_events] == [
        ("pending", "failed"),
        ("failed", "passed"),
    ]
    # errors: unknown version → 404, bad status refused locally
    res = cli(admin_url, "adapters", "gate", "gated-bot", "v9", "--status", "passed")
    assert res.exit_code == 1 and res.stderr.startswith("error: 404 version_not_found: ")
    assert cli(admin_url, "adapters", "gate", "gated-bot", "v3", "--status", "great").exit_code == 2
