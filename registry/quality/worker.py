"""The evaluation worker of the admin API process: a daemon thread with its own event loop (so a
run's hundreds of requests never share the admin API's loop), started with the app.

- :meth:`EvaluationWorker.submit` runs one evaluation (after its ``running`` row is committed):
  plan → evaluator key → :func:`registry.quality.runner.evaluate` → result and quality gate, or
  ``failed`` with the reason; the key is revoked in every case.
- With ``LORAPLANE_EVAL_IN_PROCESS=false`` the admin API only records runs (no ``worker``);
  ``loraplane serve --role evaluator`` (:func:`registry.quality.standalone.run_evaluator`) claims
  them, at most ``eval_max_runs`` at a time per process.
- Progress and a heartbeat go to the record at most every :data:`PROGRESS_EVERY_S` and at least
  every third of ``eval_stale_s``.
- The sweeper fails runs whose heartbeat is older than ``eval_stale_s`` (their process was
  killed or restarted): once at start-up, then every ``eval_stale_s / 2``. A restart therefore
  never leaves a run ``running``: it ends ``failed`` with ``interrupted: …`` and can be started
  again. On a clean shutdown the worker fails its own runs at once.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import socket
import threading
import uuid
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

import httpx
from sqlalchemy.orm import Session

from kit.errors import LoraplaneError
from registry.quality import service
from registry.quality.check_pool import CheckPool
from registry.quality.runner import GatewayUnreachable, KeyNotAccepted, RunConfig, evaluate
from registry.quality.settings import EvaluatorSettings

log = logging.getLogger("loraplane.registry.evaluator")

T = TypeVar("T")
PROGRESS_EVERY_S = 1.0
CLAIM_EVERY_S = 1.0


class Transaction(Protocol):
    """Runs ``fn(session)`` in one transaction (a change is published to the feed after commit)."""

    def __call__(self, fn: Callable[[Session], T]) -> T: ...


class EvaluationWorker:
    def __init__(self, settings: EvaluatorSettings, write: Transaction) -> None:
        self.settings = settings
        self._write = write
        self.worker_id = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._sweeper: asyncio.Task[None] | None = None
        self._claimer: asyncio.Task[None] | None = None
        self._checks = CheckPool()

    def config(self) -> RunConfig:
        s = self.settings
        url = s.gateway_url()
        if url is None:
            raise GatewayUnreachable(
                "no gateway is configured for evaluations: set LORAPLANE_EVAL_GATEWAY_URL "
                "(a registry-only process has no gateway of its own)"
            )
        return RunConfig(
            gateway_url=url,
            concurrency=s.eval_concurrency,
            seed=s.eval_seed,
            max_tokens=s.eval_max_tokens,
            request_timeout_s=s.eval_request_timeout_s,
            key_wait_s=s.eval_key_wait_s,
        )

    # -- lifecycle ----------------------------------------------------------------------------

    def start(self, *, claim: bool = False) -> EvaluationWorker:
        """Start the thread and the sweeper; ``claim``: also pick up runs nobody runs yet
        (``serve --role evaluator``)."""
        with self._lock:
            if self._thread is not None:
                return self
            loop = asyncio.new_event_loop()
            ready = threading.Event()

            def main() -> None:
                asyncio.set_event_loop(loop)
                loop.call_soon(ready.set)
                loop.run_forever()

            self._loop = loop
            self._thread = threading.Thread(target=main, name="loraplane-evaluator", daemon=True)
            self._thread.start()
            ready.wait(10)
            self._sweeper = asyncio.run_coroutine_threadsafe(self._start_sweeper(claim), loop).result(10)
        return self

    async def _start_sweeper(self, claim: bool) -> asyncio.Task[None]:
        if claim:
            self._claimer = asyncio.create_task(self._claim_forever())
        return asyncio.create_task(self._sweep_forever())

    def _claim(self, session: Session, *, limit: int) -> list[str]:
        return service.claim_unclaimed(session, self.worker_id, limit)

    async def _claim_forever(self) -> None:
        """``serve --role evaluator``: claim unclaimed runs, at most ``eval_max_runs`` at once."""
        while True:
            room = self.settings.eval_max_runs - len(self._tasks)
            if room > 0:
                try:
                    ids = await self._tx(functools.partial(self._claim, limit=room))
                except Exception as e:
                    log.warning("claiming evaluations failed: %s", e)
                    ids = []
                for eid in ids:
                    log.info("evaluation %s claimed", eid)
                    await self._spawn(eid)
            await asyncio.sleep(CLAIM_EVERY_S)

    def stop(self) -> None:
        with self._lock:
            loop, thread = self._loop, self._thread
            self._loop = self._thread = None
        if loop is None or thread is None:
            return
        try:
            asyncio.run_coroutine_threadsafe(self._shutdown(), loop).result(30)
        except Exception as e:  # a slow shutdown must not hang the process
            log.warning("evaluator shutdown: %s", e)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()
        self._checks.close()
        self._checks = CheckPool()  # idle (no process) until a restarted worker checks again

    async def _shutdown(self) -> None:
        for loop_task in (self._sweeper, self._claimer):
            if loop_task is not None:
                loop_task.cancel()
        tasks = list(self._tasks.items())
        for _, task in tasks:
            task.cancel()
        await asyncio.gather(*(t for _, t in tasks), return_exceptions=True)

    def submit(self, eval_id: str) -> None:
        self.start()
        assert self._loop is not None
        asyncio.run_coroutine_threadsafe(self._spawn(eval_id), self._loop).result(10)

    async def _spawn(self, eval_id: str) -> None:
        task = asyncio.create_task(self._run(eval_id))
        self._tasks[eval_id] = task
        task.add_done_callback(lambda _t: self._tasks.pop(eval_id, None))

    def running(self) -> list[str]:
        return list(self._tasks)

    # -- the stale-run sweeper ------------------------------------------------------------------

    def sweep_once(self) -> list[str]:
        ids = self._write(lambda s: service.fail_stale(s, self.settings.eval_stale_s))
        for eid in ids:
            log.warning("evaluation %s failed: its process stopped reporting (restart or kill)", eid)
        return ids

    async def _sweep_forever(self) -> None:
        while True:
            try:
                await asyncio.to_thread(self.sweep_once)
            except Exception as e:
                log.warning("evaluation sweep failed: %s", e)
            await asyncio.sleep(max(0.5, self.settings.eval_stale_s / 2))

    # -- one run --------------------------------------------------------------------------------

    async def _tx(self, fn: Callable[[Session], Any]) -> Any:
        return await asyncio.to_thread(self._write, fn)

    async def _run(self, eval_id: str) -> None:
        key_id: str | None = None
        try:
            plan = await self._tx(lambda s: service.plan_run(s, eval_id))
            cfg = self.config()  # before any key is issued: no gateway configured fails here
            key_id, key = await self._tx(lambda s: service.issue_eval_key(s, plan.adapter_id))
            result = await self._evaluate(eval_id, plan, key, cfg)
            await self._tx(lambda s: service.finish(s, eval_id, result))
            log.info("evaluation %s finished: %s", eval_id, result["verdict"]["gate"])
        except asyncio.CancelledError:
            await self._fail(eval_id, "interrupted: the registry process stopped during the run")
            raise
        except (GatewayUnreachable, KeyNotAccepted) as e:
            await self._fail(eval_id, str(e))
        except LoraplaneError as e:
            await self._fail(eval_id, f"{e.code}: {e.message}")
        except Exception as e:
            log.exception("evaluation %s crashed", eval_id)
            await self._fail(eval_id, f"internal error: {type(e).__name__}: {e}")
        finally:
            if key_id is not None:
                kid = key_id
                try:
                    await asyncio.shield(self._tx(lambda s: service.revoke_eval_key(s, kid)))
                except Exception as e:
                    log.warning("evaluator key %s not revoked: %s", kid, e)

    async def _fail(self, eval_id: str, error: str) -> None:
        try:
            await asyncio.shield(self._tx(lambda s: service.fail(s, eval_id, error)))
        except Exception as e:
            log.warning("evaluation %s could not be marked failed: %s", eval_id, e)

    async def _evaluate(
        self, eval_id: str, plan: service.RunPlan, key: str, cfg: RunConfig
    ) -> dict[str, Any]:
        loop = asyncio.get_running_loop()
        last_at = [0.0]
        last_done = [0]
        beat_every = min(PROGRESS_EVERY_S * 5, self.settings.eval_stale_s / 3)

        async def report(done: int) -> None:
            last_done[0] = done
            if loop.time() - last_at[0] >= PROGRESS_EVERY_S:
                last_at[0] = loop.time()
                alive = await self._tx(lambda s: service.report_progress(s, eval_id, done))
                if not alive:
                    raise asyncio.CancelledError("the evaluation is no longer running")

        async def heartbeat() -> None:
            while True:
                await asyncio.sleep(beat_every)
                if loop.time() - last_at[0] >= beat_every:
                    last_at[0] = loop.time()
                    await self._tx(lambda s: service.report_progress(s, eval_id, last_done[0]))

        beat = asyncio.create_task(heartbeat())
        try:
            timeout = httpx.Timeout(cfg.request_timeout_s, connect=min(10.0, cfg.request_timeout_s))
            limits = httpx.Limits(max_connections=cfg.concurrency + 2)
            async with httpx.AsyncClient(timeout=timeout, limits=limits, trust_env=False) as client:
                return await evaluate(client, cfg, key, plan, report, self._checks)
        finally:
            beat.cancel()
