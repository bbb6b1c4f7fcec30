"""Run checks off the event loop and out of the process, with a deadline per answer (SPEC §16).

Checks run user-supplied patterns on model output. :mod:`registry.quality.checks` bounds every
pattern it matches itself (the ``regex`` package with a timeout, one budget per answer), but a
check is only as bounded as the library under it: a JSON Schema can still reach stdlib ``re``
(``additionalProperties`` beside ``patternProperties``, a nested ``$schema`` of an older
draft), and stdlib ``re`` holds the GIL, which would freeze the whole registry process. So the
checks of one answer run in a worker *process*; an answer not checked within
``deadline_s`` (+ ``grace_s``) fails every check with reason :data:`TIMED_OUT`, and the process
is killed and replaced.

:class:`CheckPool` holds up to ``workers`` such processes, one per thread of its own executor
(started on first use). A caller that sends one answer at a time holds at most one worker, so
another caller (another adapter's canary, another evaluation) waits for at most one answer's
deadline per busy worker ahead of it, never for a whole batch.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import select
import subprocess
import sys
import threading
import time
import weakref
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import orjson

from registry.quality.checks import ANSWER_DEADLINE_S, CheckResult, run_checks

log = logging.getLogger("loraplane.quality")

TIMED_OUT = "checks timed out"
START_TIMEOUT_S = 60.0
Groups = list[list[dict[str, Any]]]


class _Dead(Exception):
    """The worker did not answer in time, or is gone."""


class _Child:
    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "registry.quality.check_worker"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            start_new_session=True,  # a terminal's Ctrl-C goes to the parent, which closes it
        )
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self._in, self._out = self.proc.stdin, self.proc.stdout.fileno()
        self._buf = bytearray()
        if self._line(time.monotonic() + START_TIMEOUT_S) != b"ready":
            self.kill()
            raise _Dead("the check worker did not start")

    def _line(self, deadline: float) -> bytes:
        while b"\n" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self._out], [], [], left)[0]:
                raise _Dead("no answer in time")
            chunk = os.read(self._out, 1 << 16)
            if not chunk:
                raise _Dead("the check worker exited")
            self._buf += chunk
        line, _, rest = self._buf.partition(b"\n")
        self._buf = bytearray(rest)
        return bytes(line)

    def ask(self, request: dict[str, Any], wait_s: float) -> Any:
        try:
            self._in.write(orjson.dumps(request) + b"\n")
            self._in.flush()
        except OSError as e:
            raise _Dead(str(e)) from e
        return orjson.loads(self._line(time.monotonic() + wait_s))

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        for f in (self.proc.stdin, self.proc.stdout):
            if f is not None:
                with contextlib.suppress(OSError):
                    f.close()
        self.proc.wait()


def _close_all(children: set[_Child], lock: threading.Lock, executor: ThreadPoolExecutor) -> None:
    executor.shutdown(wait=False, cancel_futures=True)
    with lock:
        gone = list(children)
        children.clear()
    for child in gone:
        child.kill()


class CheckPool:
    def __init__(self, workers: int = 2, deadline_s: float = ANSWER_DEADLINE_S, grace_s: float = 0.5) -> None:
        self.deadline_s = deadline_s
        self.grace_s = grace_s
        self._executor = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="loraplane-checks")
        self._local = threading.local()
        self._children: set[_Child] = set()
        self._lock = threading.Lock()
        self.timeouts = 0  # answers cut off at the deadline (their worker replaced)
        self._close = weakref.finalize(self, _close_all, self._children, self._lock, self._executor)

    def close(self) -> None:
        self._close()

    async def run(self, checks: list[dict[str, Any]], output: str | None) -> list[CheckResult]:
        """One case's checks on one output."""
        [results] = await self.run_groups([checks], output)
        return results

    async def conforms(self, groups: Groups, output: str) -> bool:
        """Whether ``output`` passes every check of at least one group."""
        results = await self.run_groups(groups, output)
        return any(all(r.passed for r in g) for g in results)

    async def run_groups(self, groups: Groups, output: str | None) -> list[list[CheckResult]]:
        if output is None:  # a failed request: nothing to match, nothing to bound
            return [run_checks(g, None) for g in groups]
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, self._call, groups, output)

    def _child(self) -> _Child:
        child: _Child | None = getattr(self._local, "child", None)
        if child is None or child.proc.poll() is not None:
            child = _Child()
            with self._lock:
                self._children.add(child)
            self._local.child = child
        return child

    def _drop(self, child: _Child) -> None:
        self._local.child = None
        with self._lock:
            self._children.discard(child)
        child.kill()

    def _call(self, groups: Groups, output: str) -> list[list[CheckResult]]:
        request = {"groups": groups, "output": output, "deadline_s": self.deadline_s}
        child: _Child | None = None
        try:
            child = self._child()
            reply = child.ask(request, self.deadline_s + self.grace_s)
        except _Dead as e:
            if child is not None:
                self._drop(child)
            self.timeouts += 1
            log.warning("checks of one answer cut off after %.1f s (%s)", self.deadline_s, e)
            reason = f"{TIMED_OUT} after {self.deadline_s:g} s"
            return [[CheckResult(str(c.get("type")), False, reason) for c in g] for g in groups]
        return [[CheckResult(str(t), bool(p), r) for t, p, r in g] for g in reply]
