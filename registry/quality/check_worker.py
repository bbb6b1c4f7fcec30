"""The child process of :class:`registry.quality.check_pool.CheckPool`:
``python -m registry.quality.check_worker``.

It says ``ready`` once its imports are done, then answers one JSON line per request line on
stdin::

    {"groups": [[check, …], …], "output": "…" | null, "deadline_s": 2.0}
    → [[["json_schema", true, null], …], …]      (per group, per check: type, passed, reason)

and exits when stdin closes (its parent is gone or closed the pool). A check that raises fails
with reason ``check error: …``; the parent kills the process when an answer runs past its
deadline.
"""

from __future__ import annotations

import signal
import sys
from typing import Any

import orjson

from registry.quality.checks import CheckResult, run_groups


def answer(request: dict[str, Any]) -> list[list[list[Any]]]:
    groups = request["groups"]
    try:
        results = run_groups(groups, request["output"], float(request["deadline_s"]))
    except Exception as e:  # a schema the library chokes on (an unresolvable $ref, …)
        reason = f"check error: {type(e).__name__}: {e}"[:300]
        results = [[CheckResult(str(c.get("type")), False, reason) for c in g] for g in groups]
    return [[[r.type, r.passed, r.reason] for r in g] for g in results]


def main() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent stops it: stdin closed, or killed
    out = sys.stdout.buffer
    out.write(b"ready\n")
    out.flush()
    for line in sys.stdin.buffer:
        out.write(orjson.dumps(answer(orjson.loads(line))) + b"\n")
        out.flush()


if __name__ == "__main__":
    main()
