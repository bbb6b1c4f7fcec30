"""``loraplane serve --role evaluator``: a process that only runs evaluations (SPEC §16).

Point the admin API at it with ``LORAPLANE_EVAL_IN_PROCESS=false`` (the admin API then only
records runs); every evaluator process claims unclaimed runs from the database (at most
``LORAPLANE_EVAL_MAX_RUNS`` at once), sends their cases to ``LORAPLANE_EVAL_GATEWAY_URL``, and
fails runs whose process stopped reporting, like the admin API's worker. Several may run: a run
is claimed by exactly one (a conditional update under a row lock). SIGINT / SIGTERM stop it; its
runs are marked failed (``interrupted: …``).
"""

from __future__ import annotations

import asyncio
import logging
import signal

from sqlalchemy import Engine

from kit.db import make_session_factory
from registry.feed import ChangeFeed
from registry.quality.settings import EvaluatorSettings
from registry.quality.worker import EvaluationWorker, Transaction
from registry.writer import ChangeWriter

log = logging.getLogger("loraplane.registry.evaluator")


def transaction(engine: Engine, feed: ChangeFeed | None) -> Transaction:
    """One transaction per call, published to the change feed after the commit (so gateways learn
    of the evaluator's keys and gates), as the admin API's writes are."""
    return ChangeWriter(make_session_factory(engine), feed)


async def run_evaluator(
    engine: Engine, feed: ChangeFeed | None, settings: EvaluatorSettings | None = None
) -> None:
    settings = settings or EvaluatorSettings()
    if not settings.gateway_url():
        raise SystemExit(
            "error: serve --role evaluator needs LORAPLANE_EVAL_GATEWAY_URL (the gateway to evaluate through)"
        )
    worker = EvaluationWorker(settings, transaction(engine, feed))
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await asyncio.to_thread(worker.start, claim=True)
    print(f"evaluator {worker.worker_id} up, gateway {settings.gateway_url()}", flush=True)
    try:
        await stop.wait()
    finally:
        await asyncio.to_thread(worker.stop)
