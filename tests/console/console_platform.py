"""Test-only helpers of the browser tier: the ``loraplane up --demo`` process and Chromium's path.

The browser is the distribution's ``chromium`` package driven by Playwright with
``executable_path`` (no browser download). A missing ``chromium`` is a test error that says how
to install it, never a silent skip.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from kit.procs import ManagedProcess, free_port, log_ready

ADMIN_TOKEN = "console-browser-admin-token-0123456789"


@dataclass
class Up:
    admin_url: str
    gateway_url: str
    data_dir: Path
    demo_key: str
    proc: ManagedProcess

    @property
    def console(self) -> str:
        return f"{self.admin_url}/admin/ui"


@contextmanager
def run_up(root: Path) -> Iterator[Up]:
    """``loraplane up --demo`` (SQLite, local artifacts, two simulated replicas, one process)."""
    data_dir = root / "data"
    port, admin_port = free_port(), free_port()
    env = {
        **os.environ,
        "LORAPLANE_ADMIN_TOKEN": ADMIN_TOKEN,
        "LORAPLANE_LOG_LEVEL": "WARNING",
        "LORAPLANE_CONSOLE_TRAFFIC_INTERVAL_S": "1",
        "PYTHONUNBUFFERED": "1",
    }
    argv = [sys.executable, "-m", "loraplane.cli", "up", "--demo", "--data-dir", str(data_dir)]
    argv += ["--replicas", "2", "--port", str(port), "--admin-port", str(admin_port)]
    log = root / "up.log"
    proc = ManagedProcess(argv, env=env, log_path=log, name="loraplane-up").start()
    try:
        proc.wait_ready(log_ready(log, "loraplane is up"), timeout=240)
        key = json.loads((data_dir / "demo_key.json").read_text())["key"]
        yield Up(f"http://127.0.0.1:{admin_port}", f"http://127.0.0.1:{port}", data_dir, key, proc)
    finally:
        proc.stop()


def chromium_path() -> str:
    path = os.environ.get("LORAPLANE_CHROMIUM") or shutil.which("chromium")
    if path is None:
        raise RuntimeError(
            "the browser tests need Debian's chromium package: apt-get install -y chromium "
            "(or LORAPLANE_CHROMIUM=/path/to/chromium); never `playwright install`"
        )
    return path
