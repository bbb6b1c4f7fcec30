"""`loraplane up --sim-behaviours` reaches the simulated replicas: through the gateway, the demo
adapters' versions answer JSON objects while the base model keeps answering plain text."""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

import httpx
import pytest

from kit.procs import ManagedProcess, free_port, log_ready

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("gw-up")]


def test_up_passes_sim_behaviours_to_its_replicas(tmp_path: Path) -> None:
    env = {**os.environ, "LORAPLANE_LOG_LEVEL": "WARNING", "PYTHONUNBUFFERED": "1"}
    for name in (
        "LORAPLANE_ADMIN_TOKEN",
        "LORAPLANE_DATA_DIR",
        "LORAPLANE_CONTEXT",
        "LORAPLANE_SIM_BEHAVIOURS",
    ):
        env.pop(name, None)
    behaviours = tmp_path / "behaviours.json"
    behaviours.write_text(json.dumps({"*@v*-*": {"output": "json"}}))  # every adapter version
    port, admin_port = free_port(), free_port()
    argv = [sys.executable, "-m", "loraplane.cli", "up", "--demo", "--replicas", "1"]
    argv += ["--port", str(port), "--admin-port", str(admin_port), "--data-dir", str(tmp_path / "d")]
    argv += ["--sim-behaviours", "behaviours.json"]  # relative: up passes it on by absolute path
    up = ManagedProcess(
        argv, env=env, cwd=tmp_path, log_path=tmp_path / "up.log", name="loraplane up"
    ).start()
    try:
        up.wait_ready(log_ready(up.log_path, "loraplane is up"), 240)
        log = up.log_path.read_text()
        key = re.search(r"demo tenant `[^`]+`, key: (\S+)", log)
        models = re.search(r"models: ([^,\s]+), ([^,\s]+)", log)
        assert key and models, log[-2000:]
        base, adapter = models.group(1), models.group(2)
        with httpx.Client(
            base_url=f"http://127.0.0.1:{port}/v1",
            headers={"Authorization": f"Bearer {key.group(1)}"},
            timeout=60,
        ) as c:

            def answer(model: str) -> str:
                r = c.post(
                    "/chat/completions",
                    json={"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 30},
                )
                assert r.status_code == 200, r.text
                return str(r.json()["choices"][0]["message"]["content"])

            assert isinstance(json.loads(answer(adapter))["answer"], str)
            assert not answer(base).lstrip().startswith("{")
    finally:
        up.stop()
