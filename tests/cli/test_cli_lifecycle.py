"""The CLI's lifecycle additions of SPEC §19 end to end against a real admin API (uvicorn on a free
port, as ``test_cli_gov``): ``adapters canary ID [--clear]``, ``adapters enable-version ID vN``,
rollback during a canary, and ``force`` in the promotions table and summaries."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from registry.demo import demo_base_model
from tests.cli import test_cli_gov
from tests.cli.test_cli_gov import TOKEN, _versions, ok, run

server = test_cli_gov.server  # the fixture: a real admin API on a free port

pytestmark = pytest.mark.xdist_group("cli-lifecycle")


def _base_model(home: Path, admin: dict[str, str]) -> None:
    if run(home, "base-models", "show", "demo-base", **admin).exit_code != 0:
        bm = demo_base_model()
        ok(run(home, "base-models", "add", "demo-base", "--hf-id", bm["hf_id"], "--max-lora-rank", "64",
               "--target-modules", ",".join(bm["target_modules"]), **admin))  # fmt: skip


def test_canary_clear_rollback_during_a_canary_and_enable_version(
    server: tuple[str, Any], tmp_path: Path
) -> None:
    url, factory = server
    admin = {"token": TOKEN, "url": url}
    _base_model(tmp_path, admin)
    ok(run(tmp_path, "adapters", "create", "life", "--base", "demo-base", "--owner", "team-l", **admin))
    _versions(factory, "life", 3)
    ok(run(tmp_path, "adapters", "promote", "life", "v1", **admin))
    ok(run(tmp_path, "adapters", "promote", "life", "v2", "--canary", "10", **admin))
    assert "life: canary v2 at 10% (active v1)" in ok(run(tmp_path, "adapters", "canary", "life", **admin))
    out = ok(run(tmp_path, "adapters", "canary", "life", "--clear", **admin))
    assert "life: canary v2 ended; no canary (active v1)" in out
    assert "life: no canary (active v1)" in ok(
        run(tmp_path, "adapters", "canary", "life", "--clear", **admin)
    )
    shown = json.loads(ok(run(tmp_path, "adapters", "canary", "life", "--json", **admin)))
    assert (shown["active_version"], shown["canary_version"], shown["canary_weight"]) == ("v1", None, None)

    # rollback while a canary runs ends the canary and keeps the active version
    ok(run(tmp_path, "adapters", "promote", "life", "v3", "--canary", "20", **admin))
    out = ok(run(tmp_path, "adapters", "rollback", "life", **admin))
    assert "life rolled back; active version: v1" in out
    assert "no canary (active v1)" in ok(run(tmp_path, "adapters", "canary", "life", **admin))

    # a version kill switch that can be undone
    ok(run(tmp_path, "adapters", "disable-version", "life", "v2", **admin))
    assert "life v2 enabled (ready)" in ok(run(tmp_path, "adapters", "enable-version", "life", "2", **admin))
    version = json.loads(ok(run(tmp_path, "adapters", "versions", "life", "v2", "--json", **admin)))
    assert version["status"] == "ready"
    again = run(tmp_path, "adapters", "enable-version", "life", "v2", **admin)
    assert (
        again.exit_code == 1
        and "409 conflict: version v2 of adapter 'life' is ready, not disabled" in again.stderr
    )


def test_promotions_show_force(server: tuple[str, Any], tmp_path: Path) -> None:
    url, factory = server
    admin = {"token": TOKEN, "url": url}
    _base_model(tmp_path, admin)
    ok(run(tmp_path, "adapters", "create", "gated", "--base", "demo-base", "--owner", "team-g", **admin))
    _versions(factory, "gated", 2)
    ok(run(tmp_path, "adapters", "promote", "gated", "v1", **admin))
    ok(run(tmp_path, "adapters", "approvals", "gated", "1", **admin))
    ok(run(tmp_path, "adapters", "gate", "gated", "v2", "--status", "failed", **admin))
    out = ok(run(tmp_path, "adapters", "promote", "gated", "v2", "--force", **admin))
    assert "(forced past its quality gate) pending: needs 1 approval(s)" in out
    pid = out.split("promotion request ")[1].split()[0]
    table = ok(run(tmp_path, "promotions", "list", "--adapter", "gated", **admin))
    header = next(line for line in table.splitlines() if "requested by" in line)
    row = next(line for line in table.splitlines() if pid in line)
    cells = [c.strip() for c in row.split("│")] if "│" in row else row.split()
    names = [c.strip() for c in header.split("│")] if "│" in header else None
    if names is not None:  # a boxed table: the force cell under its heading
        assert cells[names.index("force")] == "yes", (header, row)
    else:
        assert "force" in header and "yes" in cells, (header, row)
    listed = json.loads(ok(run(tmp_path, "promotions", "list", "--adapter", "gated", "--json", **admin)))
    assert [(p["id"], p["force"]) for p in listed] == [(pid, True)]
    shown = ok(run(tmp_path, "promotions", "show", pid, **admin))
    assert any("force" in line and "yes" in line for line in shown.splitlines()), shown
