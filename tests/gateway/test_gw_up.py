"""`loraplane up --demo` as a user runs it: starts, the printed openai example works, SIGINT and
SIGTERM stop every child, and a second `up` on the same data dir keeps its data."""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from kit.localservices import free_port
from tests.procs import alive, children

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("gw-up")]


class Up:
    def __init__(self, data_dir: Path, port: int, admin_port: int) -> None:
        env = {**os.environ, "LORAPLANE_LOG_LEVEL": "WARNING", "PYTHONUNBUFFERED": "1"}
        env.pop("LORAPLANE_ADMIN_TOKEN", None)
        self.err = open(data_dir.parent / f"up-{port}.log", "wb")  # noqa: SIM115
        argv = [sys.executable, "-m", "loraplane.cli", "up", "--demo", "--data-dir", str(data_dir)]
        argv += ["--replicas", "2", "--port", str(port), "--admin-port", str(admin_port)]
        self.proc = subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=self.err, env=env, start_new_session=True
        )
        self.lines: queue.Queue[str] = queue.Queue()
        self.out: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            self.lines.put(raw.decode())

    def wait_for(self, text: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                line = self.lines.get(timeout=0.5)
            except queue.Empty:
                if self.proc.poll() is not None:
                    break
                continue
            self.out.append(line)
            if text in line:
                return
        raise AssertionError(f"`{text}` not printed; stdout: {''.join(self.out)[-3000:]}")

    def example(self) -> str:
        text = "".join(self.out)
        start = text.index("# --- openai example ---\n") + len("# --- openai example ---\n")
        return text[start : text.index("# --- end ---")]

    def stop(self, sig: int) -> None:
        kids = children(self.proc.pid)
        assert kids, "up started no child processes (simulators)"
        self.proc.send_signal(sig)
        self.proc.wait(timeout=60)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and any(alive(k) for k in kids):
            time.sleep(0.1)
        assert not any(alive(k) for k in kids), "children left behind"
        self.err.close()

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)


def run_example(code: str) -> str:
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stderr
    return r.stdout


def test_up_demo_example_works_signals_stop_children_and_data_is_kept(tmp_path: Path) -> None:
    data = tmp_path / "data"
    port, admin_port = free_port(), free_port()
    up = Up(data, port, admin_port)
    try:
        up.wait_for("loraplane is up", 240)
        code = up.example()
        assert f"http://127.0.0.1:{port}/v1" in code
        out = run_example(code)
        assert out.startswith("demo-base:demo-support ")
        up.stop(signal.SIGINT)
        assert up.proc.returncode == 0
    finally:
        up.kill()
    # second `up` on the same data dir: same admin token, same key, adapters still there
    token = (data / "admin_token").read_text()
    up2 = Up(data, port, admin_port)
    try:
        up2.wait_for("loraplane is up", 240)
        assert up2.example() == code
        assert run_example(code).startswith("demo-base:demo-support ")
        assert (data / "admin_token").read_text() == token
        up2.stop(signal.SIGTERM)
    finally:
        up2.kill()
