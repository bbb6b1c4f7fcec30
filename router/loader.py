"""Loader: singleflight verified loads, unloads, their audit events and metrics.

At most one load of a version onto a replica is in flight at a time:
- in one process: one asyncio task per (replica, lora_name); every request for it awaits that
  task (bounded by ``load_timeout_s`` and ``max_cold_waiters_per_adapter``);
- across gateway processes (when Redis is given): the task first takes a lease
  ``SET <prefix>router:lease:<replica>:<lora_name> <token> NX PX <load_lease_ms>``, renewed
  while the load runs; a process that does not get the lease polls the shared residency
  record ``<prefix>router:res:<replica>`` (hash lora_name → state) until the holder finishes,
  then uses its result; if the holder vanished (lease expired, no record) it takes over.

A load = stage (sha256-verified, see ``router.staging``) → engine load (``EngineDriver.load``)
→ recorded as resident, one ``adapter.loaded`` or ``adapter.load_failed`` audit event
(``adapter.hash_mismatch`` instead when verification fails: nothing reaches the engine).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Callable
from typing import Any

import orjson
import redis.asyncio as aioredis
from redis.exceptions import RedisError

from registry.audit_sink import AuditSink
from registry.snapshot import VersionInfo
from router.contract import NoCapacity
from router.metrics import RouterMetrics
from router.settings import RouterSettings
from router.staging import HashMismatch, Stager, StagingError
from router.store import ReplicaState, ReplicaStore, Residency

log = logging.getLogger("loraplane.router.loader")

ACTOR = "router"

_RENEW = """
if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('pexpire', KEYS[1], ARGV[2]) end
return 0
"""
_RELEASE = """
if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end
return 0
"""


class LoadError(Exception):
    """A load did not succeed; ``retry_elsewhere`` says whether another replica may help."""

    def __init__(self, message: str, *, failure: str, retry_elsewhere: bool) -> None:
        super().__init__(message)
        self.message = message
        self.failure = failure
        self.retry_elsewhere = retry_elsewhere


class Loader:
    def __init__(
        self,
        settings: RouterSettings,
        store: ReplicaStore,
        stagers: dict[str, Stager],
        audit: AuditSink,
        metrics: RouterMetrics,
        *,
        redis: aioredis.Redis | None,
        prefix: str,
        clock: Callable[[], float],
    ) -> None:
        self._settings = settings
        self._store = store
        self._stagers = stagers
        self._audit = audit
        self._metrics = metrics
        self._redis = redis
        self._prefix = prefix
        self._clock = clock
        self._flights: dict[tuple[str, str], asyncio.Task[None]] = {}
        self._waiters: dict[str, int] = {}
        self._bg: set[asyncio.Task[Any]] = set()
        self.counts: dict[str, int] = {}  # requests per lora_name since the reconciler last looked

    # ------------------------------------------------------------------ keys

    def res_key(self, url: str) -> str:
        return f"{self._prefix}router:res:{url}"

    def lease_key(self, url: str, lora_name: str) -> str:
        return f"{self._prefix}router:lease:{url}:{lora_name}"

    def in_flight(self, url: str, lora_name: str) -> bool:
        return (url, lora_name) in self._flights

    # ------------------------------------------------------------------ public

    async def ensure_loaded(self, rep: ReplicaState, version: VersionInfo) -> bool:
        """Make ``version`` resident on ``rep``; True when the caller had to wait for a load."""
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
            task = self.start_load(rep, version)
            try:
                await asyncio.wait_for(asyncio.shield(task), self._settings.load_timeout_s)
            except TimeoutError as exc:
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

    def start_load(self, rep: ReplicaState, version: VersionInfo) -> asyncio.Task[None]:
        """The in-flight load task of (rep, version), started if there is none."""
        key = (rep.url, version.lora_name)
        task = self._flights.get(key)
        if task is None:
            # Record the load at once, so concurrent placements join it instead of starting another.
            r = rep.residents.get(version.lora_name)
            if r is None or r.state == "failed":
                self._record(rep, version, "staging")
            task = asyncio.create_task(
                self._guarded(rep, version), name=f"load:{rep.url}:{version.lora_name}"
            )
            self._flights[key] = task

            def _done(t: asyncio.Task[None], key: tuple[str, str] = key) -> None:
                if self._flights.get(key) is t:
                    del self._flights[key]
                if not t.cancelled():
                    t.exception()  # mark retrieved; waiters saw it already

            task.add_done_callback(_done)
        return task

    async def stop(self) -> None:
        from router.store import cancel_all

        await cancel_all([*self._flights.values(), *self._bg])

    def note_request(self, lora_name: str) -> None:
        """Count a request for the measured per-adapter rate (hot adapters)."""
        self.counts[lora_name] = self.counts.get(lora_name, 0) + 1

    async def forget(self, url: str, lora_name: str) -> None:
        await self._share(url, lora_name, None)

    async def forget_missing(self, url: str, listed: set[str], asked_at: float) -> None:
        """Drop shared records the replica did not list when asked at wall time ``asked_at``
        (records written after that are newer than the answer and kept)."""
        if self._redis is None:
            return
        try:
            recs = await self._redis.hgetall(self.res_key(url))
        except RedisError:
            return
        cutoff = asked_at - 0.5
        for raw_name, raw in recs.items():
            name = raw_name.decode() if isinstance(raw_name, bytes) else str(raw_name)
            if name in listed:
                continue
            try:
                rec = orjson.loads(raw)
            except orjson.JSONDecodeError:
                rec = {}
            if rec.get("state") in ("resident", "failed") and float(rec.get("ts", 0)) < cutoff:
                with contextlib.suppress(RedisError):
                    await self._redis.hdel(self.res_key(url), name)

    # ------------------------------------------------------------------ singleflight across processes

    async def _guarded(self, rep: ReplicaState, version: VersionInfo) -> None:
        try:
            await self._run(rep, version)
        except BaseException as exc:
            self._fail(rep, version.lora_name, getattr(exc, "failure", type(exc).__name__))
            raise

    async def _run(self, rep: ReplicaState, version: VersionInfo) -> None:
        if self._redis is None:
            await self._load(rep, version)
            return
        name = version.lora_name
        lease = self.lease_key(rep.url, name)
        token = uuid.uuid4().hex
        started_wall = time.time()
        deadline = self._clock() + self._settings.load_timeout_s
        while True:
            try:
                got = await self._redis.set(lease, token, nx=True, px=self._settings.load_lease_ms)
                raw = await self._redis.hget(self.res_key(rep.url), name)
            except RedisError as exc:
                raise LoadError(f"redis unavailable: {exc}", failure="other", retry_elsewhere=False) from exc
            rec = orjson.loads(raw) if raw else None
            if rec and rec.get("state") == "resident":
                if got:
                    await self._release(lease, token)
                self._mark_resident(rep, version)
                return
            if got:
                break
            if rec and rec.get("state") == "failed" and float(rec.get("ts", 0)) >= started_wall - 0.5:
                raise LoadError(
                    f"load failed in another gateway process: {rec.get('reason', '')}",
                    failure=str(rec.get("failure") or "other"),
                    retry_elsewhere=bool(rec.get("retry_elsewhere", True)),
                )
            if self._clock() > deadline:
                raise LoadError(
                    "timed out waiting for another process's load", failure="timeout", retry_elsewhere=True
                )
            await asyncio.sleep(0.05)
        renew = asyncio.create_task(self._renew(lease, token))
        try:
            await self._load(rep, version)
        finally:
            renew.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await renew
            await self._release(lease, token)

    async def _renew(self, lease: str, token: str) -> None:
        assert self._redis is not None
        period = self._settings.load_lease_ms / 3000.0
        while True:
            await asyncio.sleep(period)
            with contextlib.suppress(RedisError):
                await self._redis.eval(_RENEW, 1, lease, token, str(self._settings.load_lease_ms))  # type: ignore[misc]

    async def _release(self, lease: str, token: str) -> None:
        if self._redis is not None:
            with contextlib.suppress(RedisError):
                await self._redis.eval(_RELEASE, 1, lease, token)  # type: ignore[misc]

    async def _share(self, url: str, lora_name: str, state: str | None, **extra: Any) -> None:
        """Publish (or clear) this replica's residency record for other gateway processes."""
        if self._redis is None:
            return
        key = self.res_key(url)
        try:
            if state is None:
                await self._redis.hdel(key, lora_name)
            else:
                payload = orjson.dumps({"state": state, "ts": time.time(), **extra})
                await self._redis.hset(key, lora_name, payload)
                await self._redis.expire(key, 3600)
        except RedisError as exc:
            log.warning("cannot share residency in redis", extra={"error": str(exc)})

    # ------------------------------------------------------------------ the load itself

    def _record(self, rep: ReplicaState, version: VersionInfo, state: str) -> Residency:
        now = self._clock()
        r = rep.residents.get(version.lora_name)
        if r is None:
            r = Residency(
                lora_name=version.lora_name,
                adapter_id=version.adapter_id,
                version=version.version,
                state=state,  # type: ignore[arg-type]
                since=now,
                last_used=now,
                size_bytes=version.total_bytes,
            )
            rep.residents[version.lora_name] = r
        else:
            r.state = state  # type: ignore[assignment]
            r.since = now
            r.size_bytes = version.total_bytes or r.size_bytes
        return r

    def _mark_resident(self, rep: ReplicaState, version: VersionInfo) -> None:
        self._record(rep, version, "resident")

    async def _load(self, rep: ReplicaState, version: VersionInfo) -> None:
        name = version.lora_name
        labels = {"replica": rep.url, "adapter": version.adapter_id, "version": version.version}
        t0 = self._clock()
        details: dict[str, Any] = {"version": version.version, "replica": rep.url, "lora_name": name}
        self._record(rep, version, "staging")
        await self._share(rep.url, name, "staging")
        stager = self._stagers[rep.pool.name]
        try:
            path = await stager.stage(rep.url, rep.host, version)
        except HashMismatch as exc:
            self._fail(rep, name, "hash_mismatch")
            self._metrics.loads.labels(**labels, result="hash_mismatch").inc()
            log.error("adapter hash mismatch", extra={**details, "file": exc.file})
            await self._audit_event(
                "adapter.hash_mismatch",
                version.adapter_id,
                {**details, "file": exc.file, "expected": exc.expected, "actual": exc.actual},
            )
            await self._share(
                rep.url, name, "failed", reason=str(exc), failure="hash_mismatch", retry_elsewhere=False
            )
            raise LoadError(str(exc), failure="hash_mismatch", retry_elsewhere=False) from exc
        except StagingError as exc:
            await self._failed(rep, version, labels, details, t0, "staging_failed", str(exc), True)
            raise LoadError(str(exc), failure="staging_failed", retry_elsewhere=True) from exc
        self._record(rep, version, "loading")
        await self._share(rep.url, name, "loading")
        res = await rep.driver.load(rep.url, name, path, self._settings.load_timeout_s)
        if not (res.ok or res.failure == "conflict"):
            failure = res.failure or "other"
            if failure == "replica_down":
                self._store.mark_failure(rep, res.message, immediate=True)
            await self._failed(rep, version, labels, details, t0, failure, res.message, res.retry_elsewhere)
            raise LoadError(
                f"load of {version.adapter_id} {version.version} on {rep.url} failed "
                f"({failure}): {res.message}",
                failure=failure,
                retry_elsewhere=res.retry_elsewhere,
            )
        duration = self._clock() - t0
        self._record(rep, version, "resident")
        await self._share(rep.url, name, "resident")
        self._metrics.loads.labels(**labels, result="ok").inc()
        self._metrics.load_seconds.labels(adapter=version.adapter_id, version=version.version).observe(
            duration
        )
        log.info("adapter loaded", extra={**details, "duration_ms": round(duration * 1000, 1)})
        await self._audit_event(
            "adapter.loaded", version.adapter_id, {**details, "duration_ms": round(duration * 1000, 1)}
        )

    def _fail(self, rep: ReplicaState, lora_name: str, reason: str) -> None:
        r = rep.residents.get(lora_name)
        if r is not None and r.state != "resident":
            r.state = "failed"
            r.reason = reason
            r.since = self._clock()

    async def _failed(
        self,
        rep: ReplicaState,
        version: VersionInfo,
        labels: dict[str, str],
        details: dict[str, Any],
        t0: float,
        failure: str,
        message: str,
        retry_elsewhere: bool,
    ) -> None:
        self._fail(rep, version.lora_name, failure)
        self._metrics.loads.labels(**labels, result=failure).inc()
        duration_ms = round((self._clock() - t0) * 1000, 1)
        log.warning("adapter load failed", extra={**details, "reason": failure, "error": message})
        await self._audit_event(
            "adapter.load_failed",
            version.adapter_id,
            {**details, "duration_ms": duration_ms, "reason": failure, "message": message[:500]},
        )
        await self._share(
            rep.url,
            version.lora_name,
            "failed",
            reason=message[:200],
            failure=failure,
            retry_elsewhere=retry_elsewhere,
        )

    # ------------------------------------------------------------------ unload

    async def unload(self, rep: ReplicaState, lora_name: str, reason: str) -> bool:
        """Unload ``lora_name`` from ``rep`` (404 = already gone, fine); clean its staged files."""
        r = rep.residents.get(lora_name)
        if r is not None and r.state in ("staging", "loading", "unloading"):
            return False
        if r is not None:
            r.state = "unloading"
        res = await rep.driver.unload(rep.url, lora_name, self._settings.poll_timeout_s * 5)
        if not res.ok:
            if r is not None and rep.residents.get(lora_name) is r:
                r.state = "resident"
            log.warning(
                "adapter unload failed",
                extra={"replica": rep.url, "lora_name": lora_name, "error": res.message},
            )
            return False
        if rep.residents.get(lora_name) is r:
            rep.residents.pop(lora_name, None)
        await self._share(rep.url, lora_name, None)
        adapter_id = r.adapter_id if r else lora_name.split("@", 1)[0]
        version = r.version if r else ""
        if not res.already_gone:
            self._metrics.unloads.labels(
                replica=rep.url, adapter=adapter_id, version=version, reason=reason
            ).inc()
            log.info("adapter unloaded", extra={"replica": rep.url, "lora_name": lora_name, "reason": reason})
            await self._audit_event(
                "adapter.unloaded",
                adapter_id,
                {"version": version, "replica": rep.url, "lora_name": lora_name, "reason": reason},
            )
        await self._cleanup(rep, lora_name)
        return True

    async def _cleanup(self, rep: ReplicaState, lora_name: str) -> None:
        """Remove staged files once no replica sharing the staging location still uses them."""
        local = rep.pool.staging.mode == "local"
        for other in self._store.replicas.values():
            if other.pool.name != rep.pool.name or (not local and other.host != rep.host):
                continue
            if lora_name in other.residents:
                return
        with contextlib.suppress(StagingError, OSError):
            await self._stagers[rep.pool.name].remove(rep.host, lora_name)

    async def _audit_event(self, action: str, adapter_id: str, details: dict[str, Any]) -> None:
        try:
            await self._audit.record(
                actor=ACTOR, action=action, subject_type="adapter", subject_id=adapter_id, details=details
            )
        except Exception as exc:  # the audit sink must never break routing
            log.warning("audit record failed", extra={"action": action, "error": str(exc)})
