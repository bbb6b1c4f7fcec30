"""``kit.procs.ManagedProcess`` on real child processes: an HTTP server, a process that ignores
SIGTERM, one that exits early, one that forks a grandchild."""

from __future__ import annotations

import signal
import socket
import sys
import textwrap
import time
from pathlib import Path

import httpx
import pytest

from kit.procs import (
    ManagedProcess,
    ProcessStartError,
    free_port,
    http_ready,
    log_ready,
    ready_when,
    stop_all,
    tcp_ready,
    wait_all_ready,
    wait_for,
)
from tests.procs import alive

PY = sys.executable


def http_server(tmp_path: Path, port: int) -> ManagedProcess:
    argv = [PY, "-u", "-m", "http.server", str(port), "--bind", "127.0.0.1", "--directory", str(tmp_path)]
    return ManagedProcess(argv, log_path=tmp_path / f"http-{port}.log", name="http.server")


def script(tmp_path: Path, name: str, code: str) -> ManagedProcess:
    path = tmp_path / f"{name}.py"
    path.write_text(textwrap.dedent(code))
    return ManagedProcess([PY, "-u", str(path)], log_path=tmp_path / f"{name}.log", name=name)


def test_http_server_ready_then_stopped_by_the_context_manager(tmp_path: Path) -> None:
    (tmp_path / "hello.txt").write_text("hi")
    port = free_port()
    with http_server(tmp_path, port) as p:
        waited = p.wait_ready(http_ready(f"http://127.0.0.1:{port}/hello.txt"), timeout=30)
        assert 0 <= waited < 30
        assert p.alive() and p.pid is not None
        assert httpx.get(f"http://127.0.0.1:{port}/hello.txt").text == "hi"
        # other checks on the same server: a TCP connect, a status other than 200
        p.wait_ready(tcp_ready("127.0.0.1", port), timeout=5)
        p.wait_ready(http_ready(f"http://127.0.0.1:{port}/missing", expect=404), timeout=5)
        pid = p.pid
    assert not p.alive() and not alive(pid)
    assert p.returncode is not None
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"http://127.0.0.1:{port}/hello.txt", timeout=2)
    assert "GET /hello.txt" in p.log_path.read_text()  # the server's stderr went to the log


def test_process_ignoring_sigterm_is_killed_after_the_grace_period(tmp_path: Path) -> None:
    p = script(
        tmp_path,
        "stubborn",
        """
        import signal, time
        signal.signal(signal.SIGTERM, lambda *a: print("got SIGTERM, staying", flush=True))
        print("ready", flush=True)
        while True:
            time.sleep(0.05)
        """,
    ).start()
    try:
        p.wait_ready(log_ready(p.log_path, "ready"), timeout=30)
        t0 = time.monotonic()
        rc = p.stop(grace_s=1.0)
        took = time.monotonic() - t0
    finally:
        p.kill()
    assert rc == -9  # SIGKILL
    assert 1.0 <= took < 8.0
    assert "got SIGTERM, staying" in p.log_tail()


def test_stop_is_graceful_and_kill_is_not(tmp_path: Path) -> None:
    code = """
        import signal, sys, time
        def bye(*a):
            print("clean shutdown", flush=True)
            sys.exit(0)
        signal.signal(signal.SIGTERM, bye)
        print("ready", flush=True)
        while True:
            time.sleep(0.05)
        """
    graceful = script(tmp_path, "graceful", code).start()
    crashed = script(tmp_path, "crashed", code).start()
    try:
        wait_all_ready(
            [
                (graceful, log_ready(graceful.log_path, "ready")),
                (crashed, log_ready(crashed.log_path, "ready")),
            ],
            timeout=30,
        )
        assert graceful.stop(grace_s=10) == 0
        assert crashed.kill() == -9
    finally:
        stop_all([graceful, crashed])
    assert "clean shutdown" in graceful.log_tail()
    assert "clean shutdown" not in crashed.log_tail()
    assert graceful.stop() == 0 and crashed.kill() == -9  # idempotent


def test_early_exit_raises_with_the_log_tail(tmp_path: Path) -> None:
    p = script(tmp_path, "early", "import sys\nprint('bad config: no port', flush=True)\nsys.exit(3)\n")
    with p, pytest.raises(ProcessStartError, match="exited early with status 3") as err:
        p.wait_ready(http_ready(f"http://127.0.0.1:{free_port()}/health"), timeout=30)
    assert "bad config: no port" in str(err.value)
    assert str(p.log_path) in str(err.value)


def test_never_ready_raises_at_the_deadline_with_what_it_waited_for(tmp_path: Path) -> None:
    port = free_port()
    p = script(tmp_path, "silent", "import time\nprint('starting up', flush=True)\ntime.sleep(60)\n")
    with p:
        t0 = time.monotonic()
        with pytest.raises(ProcessStartError, match="not ready after 1s") as err:
            p.wait_ready(http_ready(f"http://127.0.0.1:{port}/health"), timeout=1.0)
        assert 1.0 <= time.monotonic() - t0 < 10
        assert p.alive()  # the caller decides whether to stop it
    msg = str(err.value)
    assert f"GET http://127.0.0.1:{port}/health -> 200" in msg and "ConnectError" in msg
    assert "starting up" in msg
    assert not p.alive()


def test_stop_takes_the_whole_process_group(tmp_path: Path) -> None:
    pid_file = tmp_path / "grandchild.pid"
    p = script(
        tmp_path,
        "parent",
        f"""
        import subprocess, sys, time
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        open({str(pid_file)!r}, "w").write(str(child.pid))
        print("forked", flush=True)
        time.sleep(600)
        """,
    )
    with p:
        p.wait_ready(log_ready(p.log_path, "forked"), timeout=30)
        grandchild = int(pid_file.read_text())
        assert alive(grandchild)
    deadline = time.monotonic() + 5
    while alive(grandchild) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive(grandchild)


def test_wait_all_ready_reports_the_one_that_exited_and_restart_appends_the_log(tmp_path: Path) -> None:
    port = free_port()
    good = http_server(tmp_path, port)
    bad = script(tmp_path, "bad", "raise SystemExit('cannot bind')\n")
    try:
        good.start().wait_ready(http_ready(f"http://127.0.0.1:{port}/"), timeout=30)
        with pytest.raises(ProcessStartError, match=r"bad \(pid \d+\) exited early") as err:
            wait_all_ready(
                [(good, http_ready(f"http://127.0.0.1:{port}/")), (bad.start(), tcp_ready("127.0.0.1", 9))],
                timeout=30,
            )
        assert "cannot bind" in str(err.value)
        first_pid = good.pid
        good.stop()
        good.start().wait_ready(http_ready(f"http://127.0.0.1:{port}/"), timeout=30)
        assert good.pid != first_pid and good.alive()
    finally:
        stop_all([good, bad], grace_s=5)
    assert not good.alive()
    assert good.log_path.read_text().count("Serving HTTP") == 2


def test_signal_then_wait_and_the_log_is_fresh_unless_appending(tmp_path: Path) -> None:
    (tmp_path / "stale.log").write_text("from an earlier run\n")
    p = script(  # logs to stale.log
        tmp_path,
        "stale",
        """
        import signal, time
        # Python ignores SIGINT when it started ignored (a background job of a non-interactive
        # shell, e.g. a CI script run with &): handle it whatever this process inherited.
        signal.signal(signal.SIGINT, signal.default_int_handler)
        print("up", flush=True)
        try:
            time.sleep(60)
        except KeyboardInterrupt:
            print("interrupted", flush=True)
        """,
    )
    with p:
        p.wait_ready(log_ready(p.log_path, "up"), timeout=30)
        with pytest.raises(TimeoutError, match="still running"):
            p.wait(0.2)
        p.signal(signal.SIGINT)  # what Ctrl-C in a terminal sends to the foreground group
        assert p.wait(30) == 0  # generous: a CI worker may be starved for seconds
    assert p.log_tail() == "up\ninterrupted\n"
    kept = ManagedProcess([PY, "-c", "print('second')"], log_path=p.log_path, append_log=True).start()
    assert kept.wait(30) == 0
    assert p.log_path.read_text() == "up\ninterrupted\nsecond\n"


def test_wait_for_checks_without_a_process() -> None:
    port = free_port()
    with pytest.raises(ProcessStartError, match=rf"waiting for TCP 127.0.0.1:{port} \(last: .*refused"):
        wait_for(tcp_ready("127.0.0.1", port), 0.3)
    with socket.create_server(("127.0.0.1", port)):
        assert wait_for(tcp_ready("127.0.0.1", port), 5) < 5
    calls: list[int] = []

    def third_time() -> bool:
        calls.append(1)
        if len(calls) == 1:
            raise ConnectionError("not listening yet")  # an exception is "not ready yet"
        return len(calls) == 3

    wait_for(ready_when("third call", third_time), 10)
    assert len(calls) == 3
    with pytest.raises(ProcessStartError, match=r"waiting for never \(last: not yet\)"):
        wait_for(ready_when("never", lambda: False), 0.2)
