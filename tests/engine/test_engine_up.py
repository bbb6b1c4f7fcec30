"""``loraplane up --engine vllm --model DIR --demo``: the quickstart on a real vLLM replica.

Runs the CLI as a user would (its own process, a fresh data directory), waits for "loraplane is
up", asks the base model and both demo adapters through the gateway with the ``openai`` client,
then sends SIGINT and checks the vLLM replica's process group is gone.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from pathlib import Path

import openai

from kit.localservices import free_port
from kit.procs import ManagedProcess, log_ready
from tests.engine.conftest import ENGINE_MARKS, EngineEnv
from tests.engine.product import _cli
from tests.procs import alive, children

pytestmark = ENGINE_MARKS

READY_S = 900.0


def test_up_engine_vllm_demo_serves_adapters_and_stops_cleanly(engine_env: EngineEnv, tmp_path: Path) -> None:
    data = tmp_path / "data"
    port, admin_port = free_port(), free_port()
    log = tmp_path / "up.log"
    cmd = [
        *_cli(), "up", "--engine", "vllm", "--model", str(engine_env.model),
        "--vllm-python", str(engine_env.python), "--device", "cpu", "--replicas", "1", "--demo",
        "--data-dir", str(data), "--port", str(port), "--admin-port", str(admin_port),
        "--max-model-len", "512",
    ]  # fmt: skip
    env = {**os.environ, "LORAPLANE_LOG_LEVEL": "WARNING"}
    env.pop("LORAPLANE_ADMIN_TOKEN", None)
    proc = ManagedProcess(cmd, env=env, log_path=log, name="loraplane up").start()
    assert proc.pid is not None
    try:
        proc.wait_ready(log_ready(log, "loraplane is up"), READY_S, max_interval=0.5)
        text = log.read_text()
        base = engine_env.model.name
        assert f"models: {base}, {base}:demo-support, {base}:demo-sql" in text
        engines = [p for p in children(proc.pid) if "vllm" in Path(f"/proc/{p}/cmdline").read_text()]
        assert len(engines) == 1, children(proc.pid)
        key = json.loads((data / "demo_key.json").read_text())["key"]
        with openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key=key, max_retries=0) as c:
            assert sorted(m.id for m in c.models.list()) == sorted(
                [base, f"{base}:demo-support", f"{base}:demo-sql"]
            )
            answers = {}
            for model in (base, f"{base}:demo-support", f"{base}:demo-sql"):
                raw = c.completions.with_raw_response.create(
                    model=model, prompt="hello world", max_tokens=8, temperature=0
                )
                body = raw.parse()
                assert body.model == model
                if model != base:
                    assert raw.headers["x-loraplane-adapter-version"] == "v1"
                answers[model] = body.choices[0].text
        # the generated demo adapters change what the real model says, and differ from each other
        assert len(set(answers.values())) == 3, answers
        proc.signal(signal.SIGINT)  # to up's process group, as Ctrl-C; each replica leads its own
        assert proc.wait(120) == 0, log.read_text()[-4000:]
        assert "stopped." in log.read_text()
        deadline = time.monotonic() + 30
        while any(alive(p) for p in engines) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not any(alive(p) for p in engines), engines
    finally:
        leftovers = children(proc.pid) if proc.alive() else set()
        proc.kill()
        for p in leftovers:  # each replica leads its own process group
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(p, signal.SIGKILL)
