"""``loraplane adapters import hf://…`` against a real registry process (``loraplane serve --role
registry``) whose hub is given only by ``HF_ENDPOINT`` (the library's own setting), and the local
fake Hub: the version lands pinned to the commit, refusals print one error line."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import Result

from kit.procs import ManagedProcess, free_port, http_ready
from registry import migrate
from registry.adapter_factory import write_adapter
from registry.admin_client import AdminClient
from registry.demo import demo_base_model
from tests.cli.cli_helpers import run_cli
from tests.registry.hubfake import FakeHub

ADMIN_TOKEN = "hf-import-cli-admin-token"
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("hf-import-cli")]  # a registry process
REPO = "my-org/support-lora"


@pytest.fixture(scope="module")
def hub() -> Iterator[FakeHub]:
    h = FakeHub()
    yield h
    h.stop()


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory, hub: FakeHub) -> Iterator[str]:
    data = tmp_path_factory.mktemp("hf-registry")
    db_url = f"sqlite:///{data / 'registry.db'}"
    migrate.upgrade(db_url)
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LORAPLANE_", "HF_"))}
    env.update(
        {
            "HF_ENDPOINT": hub.url,  # no LORAPLANE_HF_ENDPOINT: the library's variable is honoured
            "HF_HOME": str(data / "hf-home"),
            "LORAPLANE_DATABASE_URL": db_url,
            "LORAPLANE_DATA_DIR": str(data),
            "LORAPLANE_ADMIN_TOKEN": ADMIN_TOKEN,
            "LORAPLANE_ADMIN_PORT": str(port),
            "LORAPLANE_ALLOWED_SOURCES": json.dumps(["hf://my-org/*"]),
            "LORAPLANE_LOG_LEVEL": "WARNING",
        }
    )
    argv = [sys.executable, "-m", "loraplane.cli", "serve", "--role", "registry"]
    proc = ManagedProcess(argv, env=env, log_path=data / "registry.log", name="registry").start()
    url = f"http://127.0.0.1:{port}"
    try:
        proc.wait_ready(http_ready(f"{url}/admin/v1/healthz"), 120)
        with AdminClient(url, ADMIN_TOKEN) as admin:
            bm = demo_base_model()
            admin.create_base_model(
                bm["name"], bm["hf_id"], bm["max_lora_rank"], bm["target_modules"], bm["module_shapes"]
            )
            admin.create_adapter("support", base_model=bm["name"], owner="team-a")
        yield url
    finally:
        proc.stop()
        assert not (data / "hf-home").exists()  # nothing cached or left on disk by the library


def cli(url: str, *args: str) -> Result:
    return run_cli(list(args), env={"LORAPLANE_ADMIN_URL": url, "LORAPLANE_ADMIN_TOKEN": ADMIN_TOKEN})


def test_cli_import_pins_the_commit(registry: str, hub: FakeHub, tmp_path: Path) -> None:
    a = write_adapter(tmp_path / "a", rank=4)
    sha = hub.commit(REPO, {f"adapters/support/{p.name}": p.read_bytes() for p in a.iterdir()})
    hub.tag(REPO, "v1.0", sha)
    hub.commit_dir(REPO, write_adapter(tmp_path / "b", rank=16), subdir="adapters/support")  # main moves on

    res = cli(registry, "adapters", "import", f"hf://{REPO}@v1.0/adapters/support", "--adapter", "support")
    assert res.exit_code == 0, res.output
    out = res.stdout
    assert f"imported support v1 from hf://{REPO}@v1.0/adapters/support at commit {sha}" in out
    assert "adapter_model.safetensors" in out and sha in out

    res = cli(
        registry, "adapters", "import", f"hf://{REPO}@main/adapters/support",
        "--adapter", "support", "--quality-gate", "pending", "--json",
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    v2 = json.loads(res.stdout)
    assert (v2["version"], v2["rank"], v2["quality_gate"]) == ("v2", 16, "pending")
    assert v2["source_revision"] == hub.repos[REPO].refs["main"] != sha
    # files are always fetched at the resolved commit, never at the branch or tag
    assert not any(f"/resolve/{ref}/" in r.path for r in hub.requests for ref in ("main", "v1.0"))


def test_cli_import_refusals(registry: str, hub: FakeHub) -> None:
    before = len(hub.requests)
    res = cli(registry, "adapters", "import", "hf://other-org/x@main", "--adapter", "support")
    assert res.exit_code == 1
    assert res.stderr.startswith("error: 422 source_not_allowed: ")
    assert len(hub.requests) == before
    res = cli(registry, "adapters", "import", f"hf://{REPO}@no-such-branch", "--adapter", "support")
    assert res.exit_code == 1
    assert res.stderr.startswith("error: 422 revision_not_found: ")
    res = cli(registry, "adapters", "import", "s3://bucket/x/", "--adapter", "support")
    assert res.exit_code == 2 and "adapters register" in res.output
