"""`loraplane up --demo` as a user runs it: starts, the printed openai example works, SIGINT and
SIGTERM stop every child, and a second `up` on the same data dir keeps its data."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from kit.procs import ManagedProcess, free_port, log_ready
from tests.procs import alive, children

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("gw-up")]


class Up:
    """``loraplane up --demo`` as a managed process; stdout and stderr go to ``log``."""

    def __init__(self, data_dir: Path, port: int, admin_port: int, log: Path) -> None:
        env = {**os.environ, "LORAPLANE_LOG_LEVEL": "WARNING", "PYTHONUNBUFFERED": "1"}
        env.pop("LORAPLANE_ADMIN_TOKEN", None)
        argv = [sys.executable, "-m", "loraplane.cli", "up", "--demo", "--data-dir", str(data_dir)]
        argv += ["--replicas", "2", "--port", str(port), "--admin-port", str(admin_port)]
        self.proc = ManagedProcess(argv, env=env, log_path=log, name="loraplane up").start()

    def wait_for(self, text: str, timeout: float) -> None:
        self.proc.wait_ready(log_ready(self.proc.log_path, text), timeout)

    def example(self) -> str:
        text = self.proc.log_path.read_text()
        start = text.index("# --- openai example ---\n") + len("# --- openai example ---\n")
        return text[start : text.index("# --- end ---")]

    def stop(self, sig: int) -> int:
        assert self.proc.pid is not None
        kids = children(self.proc.pid)
        assert kids, "up started no child processes (simulators)"
        self.proc.signal(sig)  # to up's process group, as a terminal's Ctrl-C; children lead their own
        rc = self.proc.wait(60)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and any(alive(k) for k in kids):
            time.sleep(0.1)
        assert not any(alive(k) for k in kids), "children left behind"
        return rc


def run_example(code: str) -> str:
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stderr
    return r.stdout


def test_up_demo_example_works_signals_stop_children_and_data_is_kept(tmp_path: Path) -> None:
    data = tmp_path / "data"
    port, admin_port = free_port(), free_port()
    up = Up(data, port, admin_port, tmp_path / "up-1.log")
    try:
        up.wait_for("loraplane is up", 240)
        code = up.example()
        assert f"http://127.0.0.1:{port}/v1" in code
        out = run_example(code)
        assert out.startswith("demo-base:demo-support ")
        assert up.stop(signal.SIGINT) == 0
    finally:
        up.proc.kill()
    # second `up` on the same data dir: same admin token, same key, adapters still there
    token = (data / "admin_token").read_text()
    up2 = Up(data, port, admin_port, tmp_path / "up-2.log")
    try:
        up2.wait_for("loraplane is up", 240)
        assert up2.example() == code
        assert run_example(code).startswith("demo-base:demo-support ")
        assert (data / "admin_token").read_text() == token
        # one machine, loopback: /metrics stays on the gateway port (SPEC §19)
        m = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10)
        assert m.status_code == 200 and "loraplane_gateway_requests_total" in m.text
        up2.stop(signal.SIGTERM)
    finally:
        up2.proc.kill()
