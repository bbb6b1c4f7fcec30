"""Done-when of issue 27: `loraplane up --sim-engine sglang|ray-serve|trtllm --demo` serves the
Quickstart's openai example, and the admin flows work unchanged through the CLI — push, canary,
promote, rollback, disable — with the gateway serving what the registry says after each."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from kit.procs import ManagedProcess, free_port, log_ready
from registry.adapter_factory import write_adapter

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("gw-up")]

ADAPTER = "demo-support"


def _served(client: httpx.Client, n: int) -> set[str]:
    """The versions that answered ``n`` requests for the demo adapter (``x-loraplane-adapter-version``)."""
    seen: set[str] = set()
    for i in range(n):
        r = client.post(
            "/v1/chat/completions",
            json={"model": f"demo-base:{ADAPTER}", "messages": [{"role": "user", "content": f"hi {i}"}]},
        )
        assert r.status_code == 200, r.text
        seen.add(r.headers["x-loraplane-adapter-version"])
    return seen


def _eventually(check: object, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.2)


@pytest.mark.parametrize("sim_engine", ["sglang", "ray-serve", "trtllm"])
def test_up_with_a_simulated_engine_serves_the_example_and_the_admin_flows(
    sim_engine: str, tmp_path: Path
) -> None:
    data = tmp_path / "data"
    env = {**os.environ, "LORAPLANE_LOG_LEVEL": "WARNING", "PYTHONUNBUFFERED": "1"}
    for name in ("LORAPLANE_ADMIN_TOKEN", "LORAPLANE_CONTEXT", "LORAPLANE_ADMIN_URL"):
        env.pop(name, None)
    env["XDG_CONFIG_HOME"] = str(tmp_path / "config")
    port, admin_port = free_port(), free_port()
    argv = [sys.executable, "-m", "loraplane.cli", "up", "--demo", "--data-dir", str(data)]
    argv += [
        "--sim-engine",
        sim_engine,
        "--replicas",
        "2",
        "--port",
        str(port),
        "--admin-port",
        str(admin_port),
    ]
    up = ManagedProcess(argv, env=env, log_path=tmp_path / "up.log", name="loraplane up").start()
    try:
        up.wait_ready(log_ready(up.log_path, "loraplane is up"), 240)
        log = up.log_path.read_text()
        assert f"simulated {sim_engine} replica" in log
        example = log[log.index("# --- openai example ---\n") : log.index("# --- end ---")]
        ran = subprocess.run([sys.executable, "-c", example], capture_output=True, text=True, timeout=240)
        assert ran.returncode == 0, ran.stderr
        assert ran.stdout.startswith(f"demo-base:{ADAPTER} ")

        key = re.search(r"key: (\S+)", log)
        assert key is not None
        cli_env = {**env, "LORAPLANE_ADMIN_URL": f"http://127.0.0.1:{admin_port}"}
        cli_env["LORAPLANE_ADMIN_TOKEN"] = (data / "admin_token").read_text().strip()

        def cli(*args: str) -> str:
            r = subprocess.run(
                [sys.executable, "-m", "loraplane.cli", *args], env=cli_env, capture_output=True, text=True,
                timeout=120,
            )  # fmt: skip
            assert r.returncode == 0, r.stderr
            return r.stdout

        with httpx.Client(
            base_url=f"http://127.0.0.1:{port}",
            headers={"Authorization": f"Bearer {key.group(1)}"},
            timeout=60,
        ) as gw:
            assert _served(gw, 3) == {"v1"}
            v2 = write_adapter(tmp_path / "v2", rank=8, seed=77, target_modules=("q_proj", "v_proj"))
            assert "uploaded demo-support v2" in cli("adapters", "push", str(v2), "--adapter", ADAPTER)
            cli("adapters", "promote", ADAPTER, "v2", "--canary", "50")
            _eventually(lambda: _served(gw, 24) == {"v1", "v2"})  # the split reaches the gateway
            cli("adapters", "promote", ADAPTER, "v2")
            _eventually(lambda: _served(gw, 6) == {"v2"})
            cli("adapters", "rollback", ADAPTER)
            _eventually(lambda: _served(gw, 6) == {"v1"})
            published = data / "published"
            ours = (
                {p.name for p in published.iterdir() if p.name.startswith(ADAPTER)}
                if published.exists()
                else set()
            )
            cli("adapters", "disable", ADAPTER)
            _eventually(
                lambda: (
                    gw.post(
                        "/v1/chat/completions",
                        json={
                            "model": f"demo-base:{ADAPTER}",
                            "messages": [{"role": "user", "content": "x"}],
                        },
                    ).status_code
                    != 200
                )
            )
            if sim_engine == "ray-serve":  # disabling unpublishes: the app can no longer load it
                assert ours
                _eventually(lambda: not any((published / name).exists() for name in ours))
    finally:
        up.stop()
