"""Helpers of the quality tests: regression sets to upload, and a `loraplane up` with simulated
behaviours per adapter version (SPEC §16) for evaluations without GPUs."""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kit.procs import ManagedProcess, free_port, log_ready
from registry.adapter_factory import write_adapter
from registry.admin_client import AdminClient

ANSWER_SCHEMA = {
    "type": "object",
    "required": ["answer"],
    "properties": {"answer": {"type": "string"}},
}


def json_cases(n: int, *, max_tokens: int = 48) -> list[dict[str, Any]]:
    """``n`` chat cases whose answer must be a JSON object {"answer": str}, under 2,000
    characters, not a refusal; every third one also a regex on the opening."""
    cases: list[dict[str, Any]] = []
    for i in range(n):
        checks: list[dict[str, Any]] = [
            {"type": "json_schema", "schema": ANSWER_SCHEMA},
            {"type": "max_chars", "n": 2000},
            {"type": "refusal", "expected": False},
        ]
        if i % 3 == 0:
            checks.append({"type": "regex", "pattern": r'^\{"answer": "'})
        cases.append(
            {
                "id": f"case-{i:02d}",
                "messages": [{"role": "user", "content": f"Order {i}: where is my parcel?"}],
                "max_tokens": max_tokens,
                "checks": checks,
            }
        )
    return cases


def jsonl(cases: list[dict[str, Any]]) -> bytes:
    return ("\n".join(json.dumps(c) for c in cases) + "\n").encode()


@dataclass
class Platform:
    admin_url: str
    gateway_url: str
    token: str
    proc: ManagedProcess

    def admin(self) -> AdminClient:
        return AdminClient(self.admin_url, self.token)


@contextmanager
def platform(
    data_dir: Path, behaviours: dict[str, Any], env_extra: dict[str, str] | None = None
) -> Iterator[Platform]:
    """``loraplane up --replicas 1`` with ``behaviours`` for its simulated replica."""
    data_dir.mkdir(parents=True, exist_ok=True)
    token = "quality-test-admin-token-0123456789"
    env = {
        **os.environ,
        "LORAPLANE_LOG_LEVEL": "WARNING",
        "PYTHONUNBUFFERED": "1",
        "LORAPLANE_ADMIN_TOKEN": token,
        **(env_extra or {}),
    }
    for name in (
        "LORAPLANE_DATABASE_URL",
        "LORAPLANE_REDIS_URL",
        "LORAPLANE_S3_BUCKET",
        "LORAPLANE_EVAL_GATEWAY_URL",
    ):
        env.pop(name, None)
    port, admin_port = free_port(), free_port()
    argv = [sys.executable, "-m", "loraplane.cli", "up", "--replicas", "1", "--data-dir", str(data_dir)]
    argv += ["--port", str(port), "--admin-port", str(admin_port), "--sim-behaviours", json.dumps(behaviours)]
    log = data_dir / f"up-{time.time_ns()}.log"
    proc = ManagedProcess(argv, env=env, cwd=data_dir, log_path=log, name="loraplane up").start()
    try:
        proc.wait_ready(log_ready(log, "loraplane is up"), 240)
        yield Platform(f"http://127.0.0.1:{admin_port}", f"http://127.0.0.1:{port}", token, proc)
    finally:
        proc.stop()


def push_versions(admin: AdminClient, adapter_id: str, tmp: Path, n: int) -> list[str]:
    """Create ``adapter_id`` on demo-base and upload ``n`` versions with different weights."""
    admin.create_adapter(adapter_id, "demo-base", owner="team-a")
    out = []
    for i in range(n):
        d = tmp / f"{adapter_id}-{i}"
        write_adapter(d, seed=i + 1)
        out.append(admin.upload_version(adapter_id, d)["version"])
    return out


def wait_evaluation(
    admin: AdminClient, adapter_id: str, version: str, eval_id: str, timeout: float = 180
) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        ev = admin.get_evaluation(adapter_id, version, eval_id)
        if ev["status"] != "running":
            return ev
        assert time.monotonic() < deadline, ev
        time.sleep(0.3)
