"""Loader: singleflight verified loads and unloads, their audit events and metrics.

At most one load of a version onto a replica is in flight cluster-wide (SPEC §8, §17):
- in one process, one asyncio task per (replica, lora_name); every request for it awaits that
  task (bounded by ``load_timeout_s`` and ``max_cold_waiters_per_adapter``);
- across processes, the task first ``claim``s the slot in the cluster state
  (``router.cluster``): ``reserved`` → this process loads (after unloading the victims the claim
  marked for it, so the replica never holds more than ``max_adapters``); ``present`` → another
  process has it or is loading it: wait for its record to turn ``resident`` (or ``failed``, or
  for that process to die, then claim again); ``full`` → no idle adapter to make room with.

A load = stage (sha256-verified, see ``router.staging``) → engine load (``EngineDriver.load``)
→ recorded as resident, one ``adapter.loaded`` or ``adapter.load_failed`` audit event
(``adapter.hash_mismatch`` instead when verification fails: nothing reaches the engine).
Unloads (eviction victims included) are ``router.unloader``'s.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

from kit.aio import cancel_all
from registry.snapshot import VersionInfo
from router.audit import RouterAudit
from router.claims import SlotClaims
from router.cluster import ClusterState
from router.contract import NoCapacity
from router.drivers import LoadResult
from router.errors import LoadError
from router.fairness import FairQueue
from router.load_outcomes import FailedLoads, settle_unanswered
from router.metrics import RouterMetrics
from router.placement.types import Residency, ResidencyState
from router.settings import RouterSettings
from router.staging import HashMismatch, Stager, StagingError
from router.store import ReplicaState, ReplicaStore
from router.unloader import Unloader

log = logging.getLogger("loraplane.router.loader")

# Load failures without an answer after which the replica may still hold the adapter.
MAYBE_LOADED = frozenset({"timeout", "other"})


class Loader:
    def __init__(
        self,
        settings: RouterSettings,
        store: ReplicaStore,
        stagers: dict[str, Stager],
        audit: RouterAudit,
        metrics: RouterMetrics,
        cluster: ClusterState,
        unloader: Unloader,
        *,
        clock: Callable[[], float],
        wall: Callable[[], float] = time.time,
        is_hot: Callable[[str], bool] = lambda lora_name: False,
        fair: FairQueue | None = None,
    ) -> None:
        self._settings = settings
        self._is_hot = is_hot  # a hot version is loaded pinned where the engine can pin
        self._store = store
        self._stagers = stagers
        self._audit = audit
        self._metrics = metrics
        self._cluster = cluster
        self._unloader = unloader
        self._clock = clock
        self._wall = wall
        self._flights: dict[tuple[str, str], asyncio.Task[None]] = {}
        self._claims = SlotClaims(settings, cluster, metrics, clock=clock, wall=wall, fair=fair)
        self._outcomes = FailedLoads(metrics, audit, cluster, clock=clock)
        self._waiters: dict[str, int] = {}
        self._bg: set[asyncio.Task[Any]] = set()

    def busy(self, url: str, lora_name: str) -> bool:
        """A load or an unload of ``lora_name`` on ``url`` runs in this process."""
        return (url, lora_name) in self._flights or self._unloader.busy(url, lora_name)

    def in_flight(self, url: str, lora_name: str) -> bool:
        return (url, lora_name) in self._flights

    async def stop(self) -> None:
        await cancel_all([*self._flights.values(), *self._bg])

    # ------------------------------------------------------------------ loads

    async def ensure_loaded(
        self, rep: ReplicaState, version: VersionInfo, candidates: Sequence[str] = ()
    ) -> bool:
        """Make ``version`` resident on ``rep``; True when the caller had to wait for a load.
        ``candidates``: idle adapters of ``rep`` that may be evicted to make room, in order."""
        name = version.lora_name
        r = rep.residents.get(name)
        if r is not None and r.state == "resident":
            return False
        waiting = self._waiters.get(name, 0)
        if waiting >= self._settings.max_cold_waiters_per_adapter:
            raise NoCapacity(
                f"too many requests waiting for adapter {version.adapter_id} to load", retry_after=2
            )
        self._waiters[name] = waiting + 1
        t0 = self._clock()
        try:
            task = self.start_load(rep, version, candidates)
            try:
                await asyncio.wait_for(asyncio.shield(task), self._settings.load_timeout_s)
            except TimeoutError as exc:
                if self._claims.queued(rep.url, name):  # never got a load slot: the queue is full
                    self._metrics.placement.labels(outcome="load_queue_full").inc()
                    raise NoCapacity(
                        f"adapter {version.adapter_id} waited {self._settings.load_timeout_s:.0f}s for a "
                        "load slot (loads in flight are capped); retry shortly",
                        retry_after=2,
                    ) from exc
                raise LoadError(
                    f"adapter load did not finish within {self._settings.load_timeout_s:.0f}s",
                    failure="timeout",
                    retry_elsewhere=True,
                ) from exc
        finally:
            left = self._waiters.get(name, 1) - 1
            if left <= 0:
                self._waiters.pop(name, None)
            else:
                self._waiters[name] = left
            self._metrics.cold_wait.labels(adapter=version.adapter_id, version=version.version).observe(
                max(0.0, self._clock() - t0)
            )
        return True

    def start_load(
        self, rep: ReplicaState, version: VersionInfo, candidates: Sequence[str] = ()
    ) -> asyncio.Task[None]:
        """The in-flight load task of (rep, version), started if there is none."""
        key = (rep.url, version.lora_name)
        task = self._flights.get(key)
        if task is None:
            # Record the load at once, so concurrent placements join it instead of starting another.
            r = rep.residents.get(version.lora_name)
            if r is None or r.state == "failed":
                self._record(rep, version, "staging")
            task = asyncio.create_task(
                self._guarded(rep, version, tuple(candidates)), name=f"load:{rep.url}:{version.lora_name}"
            )
            self._flights[key] = task

            def _done(t: asyncio.Task[None], key: tuple[str, str] = key) -> None:
                if self._flights.get(key) is t:
                    del self._flights[key]
                if not t.cancelled():
                    t.exception()  # mark retrieved; waiters saw it already

            task.add_done_callback(_done)
        return task

    async def _guarded(self, rep: ReplicaState, version: VersionInfo, candidates: tuple[str, ...]) -> None:
        try:
            await self._run(rep, version, candidates)
        except BaseException as exc:
            self._claims.unqueue(rep.url, version.lora_name)
            self._outcomes.mark(
                rep, version.lora_name, exc.failure if isinstance(exc, LoadError) else type(exc).__name__
            )
            raise

    async def _run(self, rep: ReplicaState, version: VersionInfo, candidates: tuple[str, ...]) -> None:
        """Claim the load cluster-wide (or wait for the process that has it), then load."""
        name = version.lora_name
        claim = await self._claims.reserve(rep, name, candidates)
        if claim is None:  # another process loaded it meanwhile
            self._record(rep, version, "resident")
            return
        try:
            for victim in claim.evict:
                self._metrics.placement.labels(outcome="evict").inc()
                if not await self._unloader.engine_unload(rep, victim, "evict"):
                    raise LoadError(
                        f"could not unload {victim} from {rep.url} to make room",
                        failure="unload_failed",
                        retry_elsewhere=True,
                    )
        except BaseException:
            await self._cluster.drop(rep.url, name)
            raise
        await self._load(rep, version)

    # ------------------------------------------------------------------ the load itself

    def _record(self, rep: ReplicaState, version: VersionInfo, state: ResidencyState) -> None:
        now = self._clock()
        r = rep.residents.get(version.lora_name)
        if r is None:
            rep.residents[version.lora_name] = Residency(
                lora_name=version.lora_name,
                adapter_id=version.adapter_id,
                version=version.version,
                state=state,
                since=now,
                last_used=now,
                size_bytes=version.total_bytes,
                rank=version.rank,
            )
        else:
            rep.residents.change(
                version.lora_name, state=state, since=now, size_bytes=version.total_bytes or r.size_bytes
            )

    async def _load(self, rep: ReplicaState, version: VersionInfo) -> None:
        name = version.lora_name
        labels = {"replica": rep.url, "adapter": version.adapter_id, "version": version.version}
        t0 = self._clock()
        details: dict[str, Any] = {"version": version.version, "replica": rep.url, "lora_name": name}
        self._record(rep, version, "staging")
        stager = self._stagers[rep.pool.name]
        try:
            path = await stager.stage(rep.url, rep.host, version)
        except HashMismatch as exc:
            self._metrics.loads.labels(**labels, result="hash_mismatch").inc()
            log.error("adapter hash mismatch", extra={**details, "file": exc.file})
            await self._audit.event(
                "adapter.hash_mismatch",
                version.adapter_id,
                {**details, "file": exc.file, "expected": exc.expected, "actual": exc.actual},
            )
            await self._cluster.set_state(
                rep.url, name, "failed", failure="hash_mismatch", retry_elsewhere=False, reason=str(exc)
            )
            raise LoadError(str(exc), failure="hash_mismatch", retry_elsewhere=False) from exc
        except StagingError as exc:
            await self._outcomes.failed(rep, version, labels, details, t0, "staging_failed", str(exc), True)
            raise LoadError(str(exc), failure="staging_failed", retry_elsewhere=True) from exc
        except BaseException:
            await self._cluster.drop(rep.url, name)
            raise
        self._record(rep, version, "loading")
        await self._cluster.set_state(rep.url, name, "loading")
        driver = rep.driver
        pinned = driver.capabilities.pinning and self._is_hot(name)
        timeout = self._settings.load_timeout_s
        res = await driver.load(rep.url, name, path, timeout, pinned=pinned, int_id=version.int_id)
        if res.failure == "not_found":
            # The staged copy went between staging and the load (another gateway process cleaned
            # the shared directory in that moment): stage it again and try once more.
            with contextlib.suppress(StagingError):
                path = await stager.stage(rep.url, rep.host, version)
                res = await driver.load(rep.url, name, path, timeout, pinned=pinned, int_id=version.int_id)
        if not res.ok and res.status is None and res.failure in MAYBE_LOADED:
            # No answer: the replica may still finish this load. Until it shows (or is unloaded)
            # the record stays ``loading``, counted toward ``max_adapters`` (issue 24.9).
            log.warning(
                "adapter load unanswered; watching the replica", extra={**details, "error": res.message}
            )
            await self._cluster.set_state(rep.url, name, "loading", settling=True)
            if await settle_unanswered(rep, name, self._settings, self._clock):
                res = LoadResult(True)
        if not (res.ok or res.failure == "conflict"):
            failure = res.failure or "other"
            if failure == "replica_down":
                self._store.mark_failure(rep, res.message, immediate=True)
            else:
                self._store.note_failure(rep, f"load of {name} failed ({failure})", name)
                self._store.note_load(rep, name, ok=False, error=f"{failure}: {res.message[:200]}")
            await self._outcomes.failed(
                rep, version, labels, details, t0, failure, res.message, res.retry_elsewhere
            )
            raise LoadError(
                f"load of {version.adapter_id} {version.version} on {rep.url} failed "
                f"({failure}): {res.message}",
                failure=failure,
                retry_elsewhere=res.retry_elsewhere,
            )
        duration = self._clock() - t0
        self._store.note_success(rep)
        self._store.note_load(rep, name, ok=True)
        self._record(rep, version, "resident")
        await self._cluster.set_state(rep.url, name, "resident")
        self._metrics.loads.labels(**labels, result="ok").inc()
        self._metrics.load_seconds.labels(adapter=version.adapter_id, version=version.version).observe(
            duration
        )
        ms = round(duration * 1000, 1)
        log.info("adapter loaded", extra={**details, "duration_ms": ms})
        await self._audit.event("adapter.loaded", version.adapter_id, {**details, "duration_ms": ms})
