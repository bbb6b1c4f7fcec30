"""The README's five-minute tour runs exactly as written (issue 25.11).

The shell block between ``<!-- tour:begin -->`` and ``<!-- tour:end -->`` is extracted from
README.md and run by bash (``set -euo pipefail``: any failing command fails the test) in the
directory where a real ``loraplane up --demo`` runs, as a newcomer would in a second terminal
after the Quickstart. Only the ports differ from the Quickstart's (the machine may be running
other things on 8080/8081): the tour itself names no port, the CLI finds the platform through the
context ``up`` saved. ``.venv`` in that directory is this test run's environment.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from kit.procs import ManagedProcess, free_port, log_ready

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("readme-tour")]

ROOT = Path(__file__).resolve().parents[1]
TOUR = re.compile(r"<!-- tour:begin -->\s*```bash\n(.*?)```\s*<!-- tour:end -->", re.S)


def tour_block() -> str:
    found = TOUR.findall((ROOT / "README.md").read_text())
    assert len(found) == 1, "README.md must hold exactly one tour block"
    return str(found[0])


def test_the_tour_block_is_the_five_steps() -> None:
    """push → canary → promote → rollback → audit, with the CLI, in that order."""
    commands = [ln.split("#")[0].strip() for ln in tour_block().splitlines()]
    commands = [c for c in commands if c]
    steps = ["adapters push", "--canary", "adapters promote", "adapters rollback", "adapters audit"]

    def first(step: str) -> int:
        canary_promote = step == "adapters promote"
        hits = (i for i, c in enumerate(commands) if step in c and not (canary_promote and "--canary" in c))
        return next(hits)

    at = [first(s) for s in steps]
    assert at == sorted(at), commands


def test_the_readme_tour_runs_as_written(tmp_path: Path) -> None:
    work = tmp_path / "quickstart"
    work.mkdir()
    (work / ".venv").symlink_to(Path(sys.prefix))  # `source .venv/bin/activate` as in the README
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LORAPLANE_", "VIRTUAL_ENV"))}
    env.update({"XDG_CONFIG_HOME": str(tmp_path / "config"), "PYTHONUNBUFFERED": "1", "NO_COLOR": "1"})
    argv = [sys.executable, "-m", "loraplane.cli", "up", "--demo", "--replicas", "1"]
    argv += ["--port", str(free_port()), "--admin-port", str(free_port())]
    log = tmp_path / "up.log"
    up = ManagedProcess(argv, env=env, cwd=work, log_path=log, name="loraplane up").start()
    try:
        up.wait_ready(log_ready(log, "loraplane is up"), 240)
        script = "set -euo pipefail\n" + tour_block()
        res = subprocess.run(
            ["bash", "-c", script], cwd=work, env=env, capture_output=True, text=True, timeout=600
        )
        assert res.returncode == 0, f"stdout:\n{res.stdout}\nstderr:\n{res.stderr}"
        out = res.stdout
        assert "demo-support" in out and "demo-sql" in out  # the list
        assert "demo-base:demo-support" in out  # the openai example's answer names the model
        assert "uploaded demo-support v2" in out
        assert "demo-support v2 is now canary at 10%" in out and "demo-support v2 is now active" in out
        assert "demo-support rolled back; active version: v1" in out
        audit = out[out.index("Audit events") :].splitlines()
        assert "adapter.rolled_back" in audit[2], audit[:4]  # newest first
        # and the platform agrees: v1 serves again, v2 was retired by the rollback
        shown = subprocess.run(
            [sys.executable, "-m", "loraplane.cli", "adapters", "show", "demo-support", "--json"],
            cwd=work, env=env, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        rec = json.loads(shown.stdout)
        assert rec["active_version"] == "v1" and rec["canary_version"] is None
        assert {v["version"]: v["status"] for v in rec["versions"]}["v2"] == "retired"
    finally:
        up.stop()
