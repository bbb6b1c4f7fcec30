"""As a new user: `loraplane up --demo`, then `loraplane adapters list` and `loraplane whoami` in
the same directory with no token and no login — the CLI uses the admin token `up` keeps in its
data dir (before, the answer was "401 unauthorized: missing bearer token")."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from kit.procs import ManagedProcess, free_port, log_ready

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("gw-up")]


def test_cli_works_right_after_up_demo(tmp_path: Path) -> None:
    env = {**os.environ, "LORAPLANE_LOG_LEVEL": "WARNING", "PYTHONUNBUFFERED": "1"}
    for name in ("LORAPLANE_ADMIN_TOKEN", "LORAPLANE_DATA_DIR", "LORAPLANE_CONTEXT"):
        env.pop(name, None)
    env["XDG_CONFIG_HOME"] = str(tmp_path / "config")  # no saved contexts
    port, admin_port = free_port(), free_port()
    argv = [sys.executable, "-m", "loraplane.cli", "up", "--demo", "--replicas", "1"]
    argv += ["--port", str(port), "--admin-port", str(admin_port)]  # data dir: ./.loraplane
    up = ManagedProcess(
        argv, env=env, cwd=tmp_path, log_path=tmp_path / "up.log", name="loraplane up"
    ).start()
    try:
        up.wait_ready(log_ready(up.log_path, "loraplane is up"), 240)
        cli_env = {**env, "LORAPLANE_ADMIN_URL": f"http://127.0.0.1:{admin_port}", "COLUMNS": "200"}

        def cli(*args: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run(
                [sys.executable, "-m", "loraplane.cli", *args],
                cwd=tmp_path, env=cli_env, capture_output=True, text=True, timeout=120,
            )  # fmt: skip

        listed = cli("adapters", "list")
        assert listed.returncode == 0, listed.stderr
        assert "demo-support" in listed.stdout and "demo-sql" in listed.stdout
        me = cli("whoami")
        assert me.returncode == 0 and "you are bootstrap (admin" in me.stdout, me.stderr
    finally:
        up.stop()
