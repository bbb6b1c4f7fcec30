"""The governance CLI end to end against a real admin API (uvicorn on a free port): login and
contexts (file mode 0600), whoami, principals, the two-person promote, promotions, bulk with its
dry-run table and confirmation prompt."""

from __future__ import annotations

import json
import os
import stat
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import uvicorn
from pydantic import SecretStr
from typer.testing import CliRunner, Result

from kit.procs import free_port, http_ready, wait_for
from registry import migrate
from registry.demo import demo_base_model

TOKEN = "cli-gov-admin-token-0123456789"

pytestmark = pytest.mark.xdist_group("cli-gov")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Any]]:
    from kit.db import make_engine, make_session_factory
    from registry.api import create_admin_app
    from registry.settings import RegistrySettings

    data = tmp_path_factory.mktemp("registry")
    db_url = f"sqlite:///{data / 'registry.db'}"
    migrate.upgrade(db_url)
    app = create_admin_app(RegistrySettings(data_dir=data, database_url=db_url, admin_token=SecretStr(TOKEN)))
    port = free_port()
    srv = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for(http_ready(f"{url}/admin/v1/healthz", timeout=5), 120)
        yield url, make_session_factory(make_engine(db_url))
    finally:
        srv.should_exit = True
        thread.join(timeout=10)


@pytest.fixture
def home(tmp_path: Path) -> Path:
    return tmp_path


def run(home: Path, *args: str, token: str = "", url: str = "", stdin: str | None = None) -> Result:
    from loraplane.cli import app

    env = {
        "COLUMNS": "250", "NO_COLOR": "1", "XDG_CONFIG_HOME": str(home / "config"),
        "LORAPLANE_DATA_DIR": str(home / "no-up-here"), "LORAPLANE_ADMIN_URL": url,
        "LORAPLANE_ADMIN_TOKEN": token, "LORAPLANE_CONTEXT": "",
    }  # fmt: skip
    return CliRunner().invoke(app, list(args), env=env, input=stdin, catch_exceptions=False)


def ok(res: Result) -> str:
    assert res.exit_code == 0, res.output
    return res.stdout


def _versions(factory: Any, adapter_id: str, n: int) -> None:
    from tests.registry.core_support import add_versions

    add_versions(factory, adapter_id, n)


def test_login_contexts_and_two_person_promote(server: tuple[str, Any], home: Path) -> None:
    url, factory = server
    admin = {"token": TOKEN, "url": url}
    bm = demo_base_model()
    ok(run(home, "base-models", "add", "demo-base", "--hf-id", bm["hf_id"], "--max-lora-rank", "64",
           "--target-modules", ",".join(bm["target_modules"]), **admin))  # fmt: skip
    ok(run(home, "adapters", "create", "support", "--base", "demo-base", "--owner", "team-a", **admin))
    _versions(factory, "support", 2)
    ok(run(home, "adapters", "promote", "support", "v1", **admin))
    out = ok(run(home, "base-models", "update", "demo-base", "--approvals-required", "1", **admin))
    assert "need 1 approval" in out

    created = json.loads(ok(run(home, "principals", "create", "mia", "--role", "maintainer",
                                "--owners", "team-a", "--json", **admin)))  # fmt: skip
    mia_token = created["token"]["token"]
    assert mia_token.startswith("lpa-") and created["principal"]["owners"] == ["team-a"]
    out = ok(run(home, "principals", "create", "abe", "--role", "approver", "--owners", "team-a", **admin))
    abe_token = out.split("(shown once, store it now): ")[1].split()[0]

    # login keeps each context in the config dir, mode 0600, and checks the token first
    out = ok(run(home, "login", "--url", url, "--token", mia_token, "--context", "mia"))
    assert "as mia (maintainer, owners team-a)" in out
    cfg = home / "config" / "loraplane" / "contexts.json"
    assert stat.S_IMODE(os.stat(cfg).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(cfg.parent).st_mode) == 0o700
    bad = run(home, "login", "--url", url, "--token", "lpa-wrong", "--context", "x")
    assert bad.exit_code == 1 and "401 unauthorized" in bad.stderr
    ok(run(home, "login", "--url", url, "--token", abe_token, "--context", "abe"))
    saved = json.loads(cfg.read_text())
    assert saved["current"] == "abe" and set(saved["contexts"]) == {"mia", "abe"}

    assert "you are abe (approver" in ok(run(home, "whoami"))  # the current context
    assert "you are mia" in ok(run(home, "whoami", "--context", "mia"))
    assert "you are bootstrap (admin" in ok(run(home, "whoami", **admin))  # flags win
    missing = run(home, "whoami", "--context", "nope")
    assert missing.exit_code == 1 and "no context 'nope'" in missing.stderr

    out = ok(run(home, "adapters", "promote", "support", "v2", "--context", "mia"))
    assert "pending: needs 1 approval(s)" in out
    pid = out.split("promotion request ")[1].split()[0]
    denied = run(home, "promotions", "approve", pid, "--context", "mia")
    assert denied.exit_code == 1 and "403 forbidden" in denied.stderr
    listed = ok(run(home, "promotions", "list", "--status", "pending"))
    assert pid in listed and "mia" in listed
    out = ok(run(home, "promotions", "approve", pid, "--comment", "lgtm"))
    assert f"promotion request {pid} (support v2): executed, approvals 1/1 (abe)" in out
    shown = json.loads(ok(run(home, "adapters", "show", "support", "--json", **admin)))
    assert shown["active_version"] == "v2"
    shown = json.loads(ok(run(home, "promotions", "show", pid, "--json")))
    assert shown["status"] == "executed"

    # tokens: list, another one, revoke → 401
    detail = json.loads(ok(run(home, "principals", "show", "mia", "--json", **admin)))
    token_id = detail["tokens"][0]["token_id"]
    ok(run(home, "principals", "revoke", "mia", token_id, **admin))
    gone = run(home, "whoami", "--context", "mia")
    assert gone.exit_code == 1 and "401 unauthorized" in gone.stderr
    assert "token of mia" in ok(run(home, "principals", "token", "mia", **admin))
    assert "mia" in ok(run(home, "principals", "list", **admin))


def test_bulk_table_prompt_and_apply(server: tuple[str, Any], home: Path) -> None:
    url, factory = server
    admin = {"token": TOKEN, "url": url}
    if run(home, "base-models", "show", "demo-base", **admin).exit_code != 0:
        bm = demo_base_model()
        ok(run(home, "base-models", "add", "demo-base", "--hf-id", bm["hf_id"], "--max-lora-rank", "64",
               "--target-modules", ",".join(bm["target_modules"]), **admin))  # fmt: skip
    ok(run(home, "base-models", "update", "demo-base", "--approvals-required", "0", **admin))
    for aid in ("b1", "b2", "b3"):
        ok(run(home, "adapters", "create", aid, "--base", "demo-base", "--owner", "team-bulk", **admin))
        _versions(factory, aid, 2 if aid != "b3" else 1)
        ok(run(home, "adapters", "promote", aid, "v1", **admin))
        if aid != "b3":
            ok(run(home, "adapters", "promote", aid, "v2", **admin))

    out = ok(run(home, "bulk", "rollback", "--owner", "team-bulk", "--dry-run", **admin))
    assert "would apply to 2, fail for 1" in out and "v2 → v1" in out and "no_rollback_target" in out
    # the adapter that cannot roll back shows the version it keeps serving (before: "- → -")
    b3_line = next(ln for ln in out.splitlines() if ln.startswith("b3 "))
    assert "v1 (unchanged)" in b3_line, out
    dry = json.loads(ok(run(home, "bulk", "rollback", "--adapter", "b3", "--dry-run", "--json", **admin)))
    assert [(r["from_version"], r["to_version"], r["ok"]) for r in dry["results"]] == [("v1", "v1", False)]
    # answering no changes nothing
    res = run(
        home, "bulk", "rollback", "--owner", "team-bulk", "--reason", "incident 7", stdin="n\n", **admin
    )
    assert res.exit_code == 1 and "rollback 2 adapter(s)?" in res.stderr
    assert json.loads(ok(run(home, "adapters", "show", "b1", "--json", **admin)))["active_version"] == "v2"
    res = run(
        home, "bulk", "rollback", "--owner", "team-bulk", "--reason", "incident 7", stdin="y\n", **admin
    )
    assert res.exit_code == 1, res.output  # one adapter could not roll back
    assert "applied 2, failed 1" in res.stdout
    assert json.loads(ok(run(home, "adapters", "show", "b1", "--json", **admin)))["active_version"] == "v1"
    out = ok(run(home, "bulk", "disable", "--adapter", "b1", "--adapter", "b2", "--yes", "--json", **admin))
    assert json.loads(out)["applied"] == 2
    both = run(home, "bulk", "enable", "--owner", "x", "--adapter", "b1", **admin)
    assert both.exit_code == 1 and "exactly one of" in both.stderr


def test_local_up_token_is_used_without_login(server: tuple[str, Any], tmp_path: Path) -> None:
    """A new user right after `loraplane up`: no token, no login; the CLI finds up's admin token."""
    from loraplane.cli import app

    url, _ = server
    data = tmp_path / "up-data"
    data.mkdir()
    (data / "admin_token").write_text(TOKEN + "\n")
    (data / "admin_url").write_text(url + "\n")  # written by `up` next to its token
    env = {"COLUMNS": "250", "NO_COLOR": "1", "XDG_CONFIG_HOME": str(tmp_path / "cfg"),
           "LORAPLANE_DATA_DIR": str(data), "LORAPLANE_ADMIN_URL": url,
           "LORAPLANE_ADMIN_TOKEN": ""}  # fmt: skip
    res = CliRunner().invoke(app, ["adapters", "list"], env=env, catch_exceptions=False)
    assert res.exit_code == 0, res.output
    res = CliRunner().invoke(app, ["whoami"], env=env, catch_exceptions=False)
    assert "you are bootstrap (admin" in res.stdout
    env["LORAPLANE_DATA_DIR"] = str(tmp_path / "nothing")
    res = CliRunner().invoke(app, ["adapters", "list"], env=env, catch_exceptions=False)
    assert res.exit_code == 1 and "401 unauthorized: missing bearer token" in res.stderr
    assert f"hint: no admin token was found for {url}. Log in once with `loraplane login" in res.stderr


def test_a_data_dirs_token_goes_only_to_the_url_up_recorded(server: tuple[str, Any], tmp_path: Path) -> None:
    """`LORAPLANE_DATA_DIR=dd3` with `up --admin-port P`: the token goes to P, never elsewhere."""
    from loraplane.cli import app

    url, _ = server
    data = tmp_path / "dd3"
    data.mkdir()
    (data / "admin_token").write_text(TOKEN + "\n")
    (data / "admin_url").write_text(url + "\n")
    env = {"COLUMNS": "250", "NO_COLOR": "1", "XDG_CONFIG_HOME": str(tmp_path / "cfg"),
           "LORAPLANE_DATA_DIR": str(data), "LORAPLANE_ADMIN_URL": "", "LORAPLANE_ADMIN_TOKEN": "",
           "LORAPLANE_CONTEXT": ""}  # fmt: skip
    res = CliRunner().invoke(app, ["whoami"], env=env, catch_exceptions=False)
    assert res.exit_code == 0 and f"you are bootstrap (admin) at {url} (local up (" in res.stdout, res.output
    env["LORAPLANE_ADMIN_URL"] = "http://127.0.0.1:9"  # another platform: refused before sending
    res = CliRunner().invoke(app, ["adapters", "list"], env=env, catch_exceptions=False)
    assert res.exit_code == 1 and "no saved token for http://127.0.0.1:9" in res.stderr
