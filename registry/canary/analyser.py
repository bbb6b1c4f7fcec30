"""The canary analyser (SPEC §16): one loop per process, acting only while it holds the lease.

Every ``tick_s`` the lease holder reads the watched canaries (adapters with a canary and a
``canary_policy``) and, for each, both arms' counters (:mod:`registry.canary.counters`). A watch
keeps a *window*: the counters' values when the window began (baseline) and the looks already
taken. The window's evidence is the counts since that baseline; a look is due when the smaller arm
reaches ``min_requests × 2^j`` (:func:`registry.canary.decide.due_look`). After ``window_s`` a
fresh window begins (new baseline, α budget renewed), so an old canary is judged on recent
traffic.

- Each watched canary is analysed in a task of its own (a *pass*: counters, format checks,
  judgement); a tick starts a pass for every canary whose previous pass has ended and does not
  wait for them, so a canary whose checks are slow delays only itself.
- Format checks: where the adapter's regression set has ``json_schema``/``regex`` checks, each
  pass takes up to :data:`ANSWERS_PER_TICK` sampled answers of each arm and counts those that
  fail (:mod:`registry.canary.checks`), one answer at a time through the
  :class:`~registry.quality.check_pool.CheckPool` (worker processes, a deadline per answer:
  an answer cut off counts as failed); the counts belong to the window.
- Breach at a look → the canary is cleared at once (:func:`registry.canary.actions.abort_canary`,
  audit ``version.canary_aborted`` with the counts, rates and p-values). Aborts and promotions are
  written through :class:`registry.writer.ChangeWriter` with the process's change ``feed``, so
  every gateway hears of them as of the admin API's changes.
- ``auto_promote_after_s`` after the canary began, once at least one look has passed without a
  breach (a canary that never had the traffic to be judged is never promoted blind) → promote, or
  a promotion request where approvals are required (filed once per canary; a refusal such as a
  failed quality gate is retried a minute later).

A process that loses the lease forgets its windows; the next holder starts fresh ones (the
counters themselves are shared, so nothing recorded is lost, only the baseline moves).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from sqlalchemy.orm import Session, sessionmaker

from kit.aio import cancel_all
from kit.db import session_scope
from kit.errors import LoraplaneError
from registry.canary import actions
from registry.canary.checks import parse_groups
from registry.canary.counters import ArmCounts, CounterSource
from registry.canary.decide import CheckCounts, due_look, judge
from registry.canary.lease import Lease
from registry.canary.metrics import CanaryMetrics, default_metrics
from registry.feed import ChangeFeed
from registry.quality.check_pool import CheckPool
from registry.writer import ChangeWriter

log = logging.getLogger("loraplane.canary")

_RETRY_REFUSED_S = 60.0
ANSWERS_PER_TICK = 200  # sampled answers checked per arm and tick

WatchKey = tuple[str, str, str, datetime]


@dataclass(slots=True)
class _Watch:
    canary: actions.WatchedCanary
    window_start: float
    base_canary: ArmCounts
    base_active: ArmCounts
    next_look: int = 0
    checks: CheckCounts = field(default_factory=CheckCounts)
    judged: bool = False  # a look passed without breach
    requested: bool = False  # a promotion request was filed
    retry_at: float = 0.0  # after a refused auto-promotion


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).isoformat()


class CanaryAnalyser:
    def __init__(
        self,
        *,
        session_factory: sessionmaker[Session],
        counters: CounterSource,
        lease: Lease,
        promotion_ttl_s: float,
        tick_s: float = 1.0,
        metrics: CanaryMetrics | None = None,
        clock: Callable[[], float] = time.time,
        feed: ChangeFeed | None = None,
        checks: CheckPool | None = None,
    ) -> None:
        self.factory = session_factory
        self.write = ChangeWriter(session_factory, feed)  # aborts and promotions: gateways hear of them
        self.counters = counters
        self.lease = lease
        self.promotion_ttl_s = promotion_ttl_s
        self.tick_s = tick_s
        self.metrics = metrics if metrics is not None else default_metrics()
        self.clock = clock
        self.checks = checks if checks is not None else CheckPool()
        self._watches: dict[WatchKey, _Watch] = {}
        self._passes: dict[WatchKey, asyncio.Task[None]] = {}
        self._task: asyncio.Task[None] | None = None

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._loop(), name="canary-analyser")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            await cancel_all([task])
        await cancel_all(list(self._passes.values()))
        self._passes.clear()
        self.checks.close()
        await self.lease.release()
        self.metrics.leader.set(0)

    async def _loop(self) -> None:
        while True:
            try:
                await self.tick()
            except asyncio.CancelledError:
                raise
            except Exception:  # the registry or Redis down: try again next tick
                log.exception("canary analysis tick failed")
            await asyncio.sleep(self.tick_s)

    # ------------------------------------------------------------------ one tick

    async def run_once(self) -> None:
        """One tick, and wait for the passes it started (tests, one-shot tools)."""
        await asyncio.gather(*await self.tick())

    async def tick(self) -> list[asyncio.Task[None]]:
        """Start a pass for every watched canary whose previous pass has ended; the passes
        started."""
        held = await self.lease.hold()
        self.metrics.leader.set(1 if held else 0)
        if not held:
            for key in list(self._watches.keys() | self._passes.keys()):
                self._drop(key)
            return []
        watched = await asyncio.to_thread(self._read, actions.watched_canaries)
        seen: set[WatchKey] = set()
        started: list[asyncio.Task[None]] = []
        for w in watched:
            key = (w.adapter_id, w.canary_version, w.active_version, w.since)
            seen.add(key)
            running = self._passes.get(key)
            if running is None or running.done():
                task = asyncio.get_running_loop().create_task(
                    self._pass(key, w), name=f"canary-{w.adapter_id}-{w.canary_version}"
                )
                self._passes[key] = task
                started.append(task)
        for key in list(self._watches.keys() | self._passes.keys()):
            if key not in seen:
                self._drop(key)
        return started

    async def _pass(self, key: WatchKey, w: actions.WatchedCanary) -> None:
        try:
            await self._analyse(key, w)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("canary analysis of %s %s failed", w.adapter_id, w.canary_version)

    def _read(self, fn: Callable[[Session], Any]) -> Any:
        with session_scope(self.factory) as s:
            return fn(s)

    def _drop(self, key: WatchKey) -> None:
        self._watches.pop(key, None)
        task = self._passes.pop(key, None)
        if task is not None and task is not asyncio.current_task():
            task.cancel()
        self.metrics.forget(key[0], key[1])

    async def _analyse(self, key: WatchKey, w: actions.WatchedCanary) -> None:
        policy = w.policy
        c = await self.counters.read(w.adapter_id, w.canary_version)
        a = await self.counters.read(w.adapter_id, w.active_version)
        now = self.clock()
        watch = self._watches.get(key)
        if watch is None or now - watch.window_start >= policy.window_s:
            watch = _Watch(
                w, now, c, a,
                judged=watch.judged if watch else False, requested=watch.requested if watch else False,
            )  # fmt: skip
            self._watches[key] = watch
        dc, da = c.minus(watch.base_canary), a.minus(watch.base_active)
        if w.format_checks:
            await self._check_answers(w, watch.checks)
        m = self.metrics
        for arm, counts in (("canary", dc), ("active", da)):
            m.requests.labels(w.adapter_id, w.canary_version, arm).set(counts.requests)
            m.error_rate.labels(w.adapter_id, w.canary_version, arm).set(counts.error_rate or 0.0)
        look = due_look(min(dc.requests, da.requests), policy.min_requests, watch.next_look)
        if look is not None:
            verdict = judge(policy, dc, da, look=look, checks=watch.checks if w.format_checks else None)
            watch.next_look = look + 1
            for test, res in verdict.evidence["tests"].items():
                m.p_value.labels(w.adapter_id, w.canary_version, test).set(res["p_value"])
            m.looks.labels(w.adapter_id, "breach" if verdict.breach else "pass").inc()
            if verdict.breach:
                evidence = {
                    "reasons": verdict.reasons,
                    "window_s": policy.window_s,
                    "window_started_at": _iso(watch.window_start),
                    **verdict.evidence,
                }
                done = await asyncio.to_thread(self.write, lambda s: actions.abort_canary(s, w, evidence))
                if done:
                    m.aborts.labels(w.adapter_id, w.canary_version).inc()
                    log.warning(
                        "canary %s %s aborted (%s): canary %s, active %s", w.adapter_id, w.canary_version,
                        ", ".join(verdict.reasons), verdict.evidence["canary"], verdict.evidence["active"],
                    )  # fmt: skip
                self._drop(key)
                return
            watch.judged = True
        after = policy.auto_promote_after_s
        if (
            after is not None
            and watch.judged
            and not watch.requested
            and now >= watch.retry_at
            and now - w.since.timestamp() >= after
        ):
            await self._promote(key, watch, now)

    async def _check_answers(self, w: actions.WatchedCanary, into: CheckCounts) -> None:
        """One answer at a time (this canary holds at most one check worker)."""
        groups = parse_groups(w.format_checks)
        texts_c = await self.counters.take_answers(w.adapter_id, w.canary_version, ANSWERS_PER_TICK)
        for text in texts_c:
            ok = await self.checks.conforms(groups, text)
            into.canary_checked += 1
            into.canary_failed += 0 if ok else 1
        texts_a = await self.counters.take_answers(w.adapter_id, w.active_version, ANSWERS_PER_TICK)
        for text in texts_a:
            ok = await self.checks.conforms(groups, text)
            into.active_checked += 1
            into.active_failed += 0 if ok else 1

    async def _promote(self, key: WatchKey, watch: _Watch, now: float) -> None:
        w = watch.canary
        try:
            kind = await asyncio.to_thread(
                self.write, lambda s: actions.auto_promote(s, w, ttl_s=self.promotion_ttl_s)
            )
        except LoraplaneError as e:
            log.warning(
                "auto-promotion of %s %s refused: %s %s", w.adapter_id, w.canary_version, e.code, e.message
            )
            watch.retry_at = now + _RETRY_REFUSED_S
            return
        if kind == "gone":
            return
        self.metrics.promotions.labels(w.adapter_id, w.canary_version, kind).inc()
        log.info("canary %s %s auto-%s", w.adapter_id, w.canary_version, kind)
        if kind == "requested":
            watch.requested = True
        else:
            self._drop(key)
