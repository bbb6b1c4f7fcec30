"""Start simulated replicas as real processes (tests, benchmarks, ``loraplane up``).

::

    procs = start_simulators(2, model="demo-base", extra_args=["--zero-latency"])
    procs[0].url            # http://127.0.0.1:PORT, /health already answers 200
    procs[0].kill()         # SIGKILL (failure tests); procs[0].restart() brings it back
    stop_all(procs)         # SIGTERM, then SIGKILL after a grace period

    with simulators(2, extra_args=["--zero-latency"]) as procs: ...

Each process runs ``sys.executable -m simulator`` on a free loopback port as a
:class:`kit.procs.ManagedProcess` (own session, SIGTERM then SIGKILL, killed at interpreter
exit), logs to a temporary file (``SimProcess.log_path``), and exits by itself if the process
that started it goes away (``LORAPLANE_SIM_PARENT_PID``).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

from kit import procs as kp
from kit.procs import free_port
from simulator.cli import PARENT_ENV

__all__ = ["SimProcess", "SimulatorStartError", "free_port", "simulators", "start_simulators", "stop_all"]


class SimulatorStartError(kp.ProcessStartError):
    """A simulator process exited or did not answer /health in time."""


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
        engine: str = "vllm",
    ) -> None:
        self.model = model
        self.engine = engine  # which engine's HTTP API (``--engine``); decides the health path
        self.host = host
        self.port = port or free_port()
        self.extra_args = list(extra_args or [])
        self.env = dict(env or {})
        self.ready_timeout = ready_timeout
        self.managed: kp.ManagedProcess | None = None
        fd, name = tempfile.mkstemp(prefix=f"sim-{self.port}-", suffix=".log")
        os.close(fd)
        self.log_path = Path(name)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def proc(self) -> subprocess.Popen[bytes] | None:
        return self.managed.proc if self.managed is not None else None

    @property
    def pid(self) -> int | None:
        return self.managed.pid if self.managed is not None else None

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
            *(["--engine", self.engine] if self.engine != "vllm" else []),
            *self.extra_args,
        ]

    def start(self) -> SimProcess:
        if self.alive():
            return self
        env = {**os.environ, **self.env, PARENT_ENV: str(os.getpid())}
        env.setdefault("PYTHONUNBUFFERED", "1")
        # a new ManagedProcess each time: the port (so the argv) may have changed since
        self.managed = kp.ManagedProcess(
            self.argv(),
            env=env,
            log_path=self.log_path,
            name=f"simulator on port {self.port}",
            append_log=True,
        ).start()
        return self

    def wait_ready(self, timeout: float | None = None) -> None:
        """Wait until ``/health`` answers (200, or 503 for a replica started dead on purpose: it
        answers, so it is up); on timeout the process is killed."""
        if self.managed is None:
            raise SimulatorStartError(f"simulator on port {self.port} was never started")
        health = "/-/healthz" if self.engine == "ray-serve" else "/health"
        check = kp.http_ready(f"{self.url}{health}", expect=(200, 503), timeout=1.0)
        try:
            self.managed.wait_ready(check, self.ready_timeout if timeout is None else timeout)
        except kp.ProcessStartError as e:
            self.kill()
            raise SimulatorStartError(str(e)) from None

    def log_tail(self, n: int = 4000) -> str:
        with contextlib.suppress(OSError):
            return self.log_path.read_text(errors="replace")[-n:]
        return ""

    def alive(self) -> bool:
        return self.managed is not None and self.managed.alive()

    def stop(self, grace: float = 5.0) -> None:
        """SIGTERM, then SIGKILL after ``grace`` seconds."""
        if self.managed is not None:
            self.managed.stop(grace)

    def kill(self) -> None:
        """SIGKILL at once (for failure tests)."""
        if self.managed is not None:
            self.managed.kill()

    def restart(self, timeout: float | None = None) -> SimProcess:
        """Stop if running, start again on the same port, wait until ready."""
        self.stop()
        self.start()
        self.wait_ready(timeout)
        return self

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
    engine: str = "vllm",
) -> list[SimProcess]:
    """Start ``n`` simulators on free ports (in parallel) and wait until each answers its health
    check (``engine``: which engine's HTTP API they speak)."""
    procs: list[SimProcess] = []
    try:
        for _ in range(n):
            procs.append(
                SimProcess(
                    model=model, extra_args=extra_args, env=env, ready_timeout=ready_timeout, engine=engine
                ).start()
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
    """Stop every simulator (SIGTERM to all at once, one grace period) and remove their logs."""
    kp.stop_all([p.managed for p in procs if p.managed is not None], grace)
    for p in procs:
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
