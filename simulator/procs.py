"""Start simulated replicas as real processes (tests, benchmarks, ``loraplane up``).

::

    procs = start_simulators(2, model="demo-base", extra_args=["--zero-latency"])
    procs[0].url            # http://127.0.0.1:PORT, /health already answers 200
    procs[0].kill()         # SIGKILL (failure tests); procs[0].restart() brings it back
    stop_all(procs)         # SIGTERM, then SIGKILL after a grace period

    with simulators(2, extra_args=["--zero-latency"]) as procs: ...

Each process runs ``sys.executable -m simulator`` in its own session on a free loopback port,
logs to a temporary file (``SimProcess.log_path``), and exits by itself if the process that
started it goes away (``LORAPLANE_SIM_PARENT_PID``). Processes still running when the
interpreter exits are killed (``atexit``).
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from simulator.cli import PARENT_ENV

_LIVE: set[SimProcess] = set()
_LIVE_LOCK = threading.Lock()


class SimulatorStartError(RuntimeError):
    """A simulator process exited or did not answer /health in time."""


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class SimProcess:
    """One simulator process. ``stop()`` is idempotent; ``restart()`` reuses the port."""

    def __init__(
        self,
        *,
        model: str = "demo-base",
        port: int | None = None,
        extra_args: list[str] | None = None,
        env: dict[str, str] | None = None,
        ready_timeout: float = 20.0,
        host: str = "127.0.0.1",
    ) -> None:
        self.model = model
        self.host = host
        self.port = port or free_port()
        self.extra_args = list(extra_args or [])
        self.env = dict(env or {})
        self.ready_timeout = ready_timeout
        self.proc: subprocess.Popen[bytes] | None = None
        fd, name = tempfile.mkstemp(prefix=f"sim-{self.port}-", suffix=".log")
        os.close(fd)
        self.log_path = Path(name)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def argv(self) -> list[str]:
        return [
            sys.executable,
            "-m",
            "simulator",
            "--host",
            self.host,
            "--port",
            str(self.port),
            "--model",
            self.model,
            *self.extra_args,
        ]

    def start(self) -> SimProcess:
        if self.proc is not None and self.proc.poll() is None:
            return self
        env = {**os.environ, **self.env, PARENT_ENV: str(os.getpid())}
        env.setdefault("PYTHONUNBUFFERED", "1")
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                self.argv(),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
            )
        with _LIVE_LOCK:
            _LIVE.add(self)
        return self

    def wait_ready(self, timeout: float | None = None) -> None:
        deadline = time.monotonic() + (timeout if timeout is not None else self.ready_timeout)
        delay = 0.02
        while time.monotonic() < deadline:
            if self.proc is None or self.proc.poll() is not None:
                raise SimulatorStartError(f"simulator on port {self.port} exited early:\n{self.log_tail()}")
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=1.0) as resp:
                    if resp.status == 200:
                        return
            except urllib.error.HTTPError as exc:
                if exc.code == 503:  # started dead on purpose: it answers, so it is up
                    return
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(delay)
            delay = min(delay * 1.5, 0.2)
        self.kill()
        raise SimulatorStartError(f"simulator on port {self.port} not ready in time:\n{self.log_tail()}")

    def log_tail(self, n: int = 4000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-n:]
        except OSError:
            return ""

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def _signal_group(self, sig: int) -> None:
        if self.proc is None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, sig)

    def stop(self, grace: float = 5.0) -> None:
        """SIGTERM, then SIGKILL after ``grace`` seconds."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self._signal_group(signal.SIGTERM)
            try:
                self.proc.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                self._signal_group(signal.SIGKILL)
                self.proc.wait(timeout=5)
        self._forget()

    def kill(self) -> None:
        """SIGKILL at once (for failure tests)."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self._signal_group(signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=5)
        self._forget()

    def restart(self, timeout: float | None = None) -> SimProcess:
        """Stop if running, start again on the same port, wait until ready."""
        self.stop()
        self.start()
        self.wait_ready(timeout)
        return self

    def _forget(self) -> None:
        with _LIVE_LOCK:
            _LIVE.discard(self)

    def cleanup(self) -> None:
        """Stop and remove the log file."""
        self.stop()
        with contextlib.suppress(OSError):
            self.log_path.unlink()

    def __repr__(self) -> str:
        return f"SimProcess(url={self.url!r}, pid={self.pid}, alive={self.alive()})"


def start_simulators(
    n: int,
    *,
    model: str = "demo-base",
    extra_args: list[str] | None = None,
    env: dict[str, str] | None = None,
    ready_timeout: float = 20.0,
) -> list[SimProcess]:
    """Start ``n`` simulators on free ports (in parallel) and wait until each answers /health."""
    procs: list[SimProcess] = []
    try:
        for _ in range(n):
            procs.append(
                SimProcess(model=model, extra_args=extra_args, env=env, ready_timeout=ready_timeout).start()
            )
        for p in procs:
            for attempt in range(3):
                try:
                    p.wait_ready()
                    break
                except SimulatorStartError:
                    if attempt == 2 or "address already in use" not in p.log_tail().lower():
                        raise
                    p.port = free_port()
                    p.start()
    except BaseException:
        stop_all(procs)
        raise
    return procs


def stop_all(procs: list[SimProcess], grace: float = 5.0) -> None:
    for p in procs:
        if p.alive():
            p._signal_group(signal.SIGTERM)
    for p in procs:
        p.stop(grace)
        with contextlib.suppress(OSError):
            p.log_path.unlink()


@contextlib.contextmanager
def simulators(
    n: int,
    *,
    model: str = "demo-base",
    extra_args: list[str] | None = None,
    env: dict[str, str] | None = None,
    ready_timeout: float = 20.0,
) -> Iterator[list[SimProcess]]:
    procs = start_simulators(n, model=model, extra_args=extra_args, env=env, ready_timeout=ready_timeout)
    try:
        yield procs
    finally:
        stop_all(procs)


@atexit.register
def _kill_leftovers() -> None:
    with _LIVE_LOCK:
        left = list(_LIVE)
    for p in left:
        p.kill()
