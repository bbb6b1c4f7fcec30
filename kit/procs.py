"""Managed child processes: start in a new session, wait for a readiness check, stop with SIGTERM
then SIGKILL — the one helper that the engine launcher, the simulator pool, ``loraplane up``,
the benchmarks and the tests use for every long-running child.

::

    with ManagedProcess([sys.executable, "-m", "http.server", str(port)], log_path=log) as p:
        p.wait_ready(http_ready(f"http://127.0.0.1:{port}/"), timeout=30)
        ...                       # on exit: SIGTERM to the process group, SIGKILL after grace_s

Each process leads its own session (so its process group holds every child it forks: vLLM's
engine core and workers, a shell's commands), reads nothing from stdin and writes stdout and
stderr to ``log_path`` (a temporary file when none is given). ``wait_ready`` raises
:class:`ProcessStartError`, with the last lines of the log, when the process exits or the check
does not pass in time. Processes still running when the interpreter exits are killed.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Protocol, Self

import httpx

__all__ = [
    "ManagedProcess",
    "ProcessStartError",
    "ReadyCheck",
    "free_port",
    "http_ready",
    "log_ready",
    "ready_when",
    "stop_all",
    "tcp_ready",
    "wait_all_ready",
    "wait_for",
]


class ProcessStartError(RuntimeError):
    """A managed process exited before it was ready, or its check did not pass in time."""


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nothing listens on right now (the kernel's pick)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


# --------------------------------------------------------------------------- readiness checks


class ReadyCheck(Protocol):
    """``poll()`` returns None once ready, else what it saw instead (for the error message)."""

    what: str

    def poll(self) -> str | None: ...

    def close(self) -> None: ...


class _HttpReady:
    def __init__(self, url: str, expect: Collection[int], timeout: float) -> None:
        self.url, self.expect, self.timeout = url, expect, timeout
        self.what = f"GET {url} -> {'/'.join(map(str, sorted(expect)))}"
        self._client: httpx.Client | None = None

    def poll(self) -> str | None:
        if self._client is None:  # proxies never apply to the child we just started
            self._client = httpx.Client(timeout=self.timeout, trust_env=False)
        try:
            status = self._client.get(self.url).status_code
        except httpx.HTTPError as e:
            return f"{type(e).__name__}: {e}"
        return None if status in self.expect else f"status {status}"

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None


def http_ready(url: str, expect: int | Collection[int] = 200, timeout: float = 2.0) -> ReadyCheck:
    """Ready when ``GET url`` answers with ``expect`` (a status or a set of them)."""
    return _HttpReady(url, {expect} if isinstance(expect, int) else set(expect), timeout)


class _FnReady:
    def __init__(self, what: str, fn: Callable[[], str | None]) -> None:
        self.what, self._fn = what, fn

    def poll(self) -> str | None:
        return self._fn()

    def close(self) -> None:
        return None


def ready_when(what: str, fn: Callable[[], bool]) -> ReadyCheck:
    """Ready when ``fn()`` is true; an exception from ``fn`` counts as not ready yet."""

    def poll() -> str | None:
        try:
            return None if fn() else "not yet"
        except Exception as e:
            return f"{type(e).__name__}: {e}"

    return _FnReady(what, poll)


def tcp_ready(host: str, port: int, timeout: float = 0.5) -> ReadyCheck:
    """Ready when a TCP connection to ``host:port`` succeeds."""

    def poll() -> str | None:
        try:
            with socket.create_connection((host, port), timeout=timeout):
                return None
        except OSError as e:
            return str(e)

    return _FnReady(f"TCP {host}:{port}", poll)


def log_ready(path: str | Path, text: str) -> ReadyCheck:
    """Ready when the file at ``path`` (typically the process's own log) contains ``text``."""

    def poll() -> str | None:
        with contextlib.suppress(OSError):
            if text in Path(path).read_text(errors="replace"):
                return None
        return "not printed yet"

    return _FnReady(f"{text!r} in {path}", poll)


# --------------------------------------------------------------------------- the process

_LIVE: set[ManagedProcess] = set()
_LIVE_LOCK = threading.Lock()


class ManagedProcess:
    """One child process in its own session. ``start()`` is a no-op while it runs; ``stop()`` and
    ``kill()`` are idempotent; after a stop it can be started again (same argv). The first start
    empties the log file unless ``append_log``; a restart always appends to it."""

    def __init__(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | Path | None = None,
        log_path: str | Path | None = None,
        name: str | None = None,
        append_log: bool = False,
    ) -> None:
        self.argv = [str(a) for a in argv]
        self.env = dict(env) if env is not None else None  # None: this process's environment
        self.cwd = cwd
        self.name = name or Path(self.argv[0]).name
        if log_path is None:
            safe = "".join(c if c.isalnum() or c in "._-" else "-" for c in self.name)
            fd, tmp = tempfile.mkstemp(prefix=f"{safe}-", suffix=".log")
            os.close(fd)
            log_path = tmp
        self.log_path = Path(log_path)
        self._append = append_log
        self.proc: subprocess.Popen[bytes] | None = None
        self.started_at = 0.0

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    @property
    def returncode(self) -> int | None:
        return self.proc.poll() if self.proc is not None else None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self) -> Self:
        if self.alive():
            return self
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab" if self._append else "wb") as log:
            self.proc = subprocess.Popen(
                self.argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self.env,
                cwd=self.cwd,
                start_new_session=True,
            )
        self._append = True  # a restart keeps what the earlier run wrote
        self.started_at = time.monotonic()
        with _LIVE_LOCK:
            _LIVE.add(self)
        return self

    def log_tail(self, n: int = 4000) -> str:
        with contextlib.suppress(OSError):
            return self.log_path.read_text(errors="replace")[-n:]
        return ""

    def check_running(self) -> None:
        """Raise :class:`ProcessStartError` (with the log tail) if the process is not running."""
        if self.proc is None:
            raise ProcessStartError(f"{self.name} was never started")
        if self.proc.poll() is not None:
            raise ProcessStartError(
                f"{self.name} (pid {self.proc.pid}) exited early with status {self.proc.returncode}; "
                f"log {self.log_path}:\n{self.log_tail()}"
            )

    def wait_ready(self, check: ReadyCheck, timeout: float, *, max_interval: float = 0.25) -> float:
        """Poll ``check`` until it passes; return the seconds waited. Raises
        :class:`ProcessStartError` if the process exits or ``timeout`` seconds pass."""
        return wait_all_ready([(self, check)], timeout, max_interval=max_interval)

    def wait(self, timeout: float) -> int:
        """Wait for the process to exit by itself (after a signal, say); return its status.
        Raises ``TimeoutError`` if it still runs after ``timeout`` seconds."""
        if self.proc is None:
            raise ProcessStartError(f"{self.name} was never started")
        try:
            rc = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise TimeoutError(f"{self.name} (pid {self.proc.pid}) still running after {timeout}s") from None
        return rc

    def signal(self, sig: int) -> None:
        """Send ``sig`` to the whole process group (nothing if it is gone)."""
        if self.proc is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, sig)

    def stop(self, grace_s: float = 10.0) -> int | None:
        """SIGTERM the process group, SIGKILL it after ``grace_s`` (and any stragglers the leader
        left behind), reap; return the exit status."""
        stop_all([self], grace_s)
        return self.returncode

    def kill(self) -> int | None:
        """SIGKILL the process group now, no SIGTERM first, and reap (a crash, for failure tests)."""
        self._finish(time.monotonic(), term_sent=False)
        return self.returncode

    def _finish(self, deadline: float, term_sent: bool) -> None:
        proc = self.proc
        if proc is None:
            return
        if term_sent:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        self.signal(signal.SIGKILL)  # the leader if still there, and stragglers in its group
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=10)
        with _LIVE_LOCK:
            _LIVE.discard(self)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"ManagedProcess({self.name!r}, pid={self.pid}, alive={self.alive()})"


def wait_for(check: ReadyCheck, timeout: float, *, max_interval: float = 0.25) -> float:
    """Wait until ``check`` passes for a server that is not a child process (a uvicorn thread, a
    shared service); return the seconds waited. Raises :class:`ProcessStartError` at the deadline."""
    return wait_all_ready([(None, check)], timeout, max_interval=max_interval)


def wait_all_ready(
    items: Sequence[tuple[ManagedProcess | None, ReadyCheck]], timeout: float, *, max_interval: float = 0.25
) -> float:
    """Wait until every process's check passes (all polled in turn, one deadline); return the
    seconds waited. Raises :class:`ProcessStartError` as soon as one exits, or at the deadline.
    A ``None`` process means a check with no process to watch."""
    t0 = time.monotonic()
    deadline = t0 + timeout
    pending = list(items)
    last: dict[int, str] = {}
    delay = 0.02
    try:
        while True:
            for i, (proc, check) in enumerate(pending):
                if proc is not None:
                    proc.check_running()
                seen = check.poll()
                if seen is None:
                    check.close()
                    pending[i] = (proc, _DONE)
                else:
                    last[id(check)] = seen
            pending = [(p, c) for p, c in pending if c is not _DONE]
            if not pending:
                return time.monotonic() - t0
            if time.monotonic() >= deadline:
                proc, check = pending[0]
                what = f"not ready after {timeout:.0f}s waiting for {check.what}"
                what += f" (last: {last.get(id(check), '-')})"
                if proc is not None:
                    what = f"{proc.name} (pid {proc.pid}) {what}; log {proc.log_path}:\n{proc.log_tail()}"
                raise ProcessStartError(what)
            time.sleep(min(delay, max(0.0, deadline - time.monotonic())))
            delay = min(delay * 1.5, max_interval)
    finally:
        for _, check in pending:
            check.close()


_DONE: ReadyCheck = _FnReady("done", lambda: None)


def stop_all(procs: Sequence[ManagedProcess], grace_s: float = 10.0) -> None:
    """SIGTERM every running process group at once, then give all of them ``grace_s`` together
    before SIGKILL (so stopping N processes takes one grace period, not N)."""
    termed = []
    for p in procs:
        if p.alive():
            p.signal(signal.SIGTERM)
            termed.append(p)
    deadline = time.monotonic() + grace_s
    for p in procs:
        p._finish(deadline, term_sent=p in termed)


@atexit.register
def _kill_leftovers() -> None:
    with _LIVE_LOCK:
        left = list(_LIVE)
    for p in left:
        p.kill()
