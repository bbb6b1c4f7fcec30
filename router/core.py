"""The router runtime: ``Router`` ties the replica store, placement, loader and forwarding together.

Per request (``forward``): replicas of the base model → ``ReplicaView``s → the placement
profile's ``Decision`` → evict what it lists → singleflight verified load if needed → forward
(streaming or not) with ``model`` rewritten; one retry on another replica after a load
failure that may succeed elsewhere or an error before the first byte.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any

import aiohttp
import orjson
import redis.asyncio as aioredis
from prometheus_client import CollectorRegistry
from redis.exceptions import RedisError

from registry.audit_sink import AuditSink
from registry.replicas import ReplicaDirectory
from registry.snapshot import RoutingSnapshot, VersionInfo
from router.contract import (
    AdapterLoadFailed,
    ForwardRequest,
    ForwardResult,
    NoCapacity,
    RouterError,
    UpstreamError,
)
from router.drivers import ModelsInfo, make_driver
from router.forwarding import (
    Retryable,
    StreamRelay,
    WrongAdapter,
    make_rewriter,
    open_upstream,
    parse_usage,
    read_body,
)
from router.loader import ACTOR, Loader, LoadError
from router.metrics import router_metrics
from router.placement.types import Decision, PlacementRequest, Profile
from router.reconciler import Reconciler
from router.settings import RouterSettings
from router.staging import AgentStager, LocalStager, ReadableStore, Stager
from router.store import ReplicaState, ReplicaStore, cancel_all, views

log = logging.getLogger("loraplane.router")


class Router:
    """One per gateway process. See ``router.contract`` for what ``forward`` promises."""

    def __init__(
        self,
        settings: RouterSettings,
        *,
        store: ReadableStore,
        audit: AuditSink,
        redis: aioredis.Redis | None = None,
        clock: Callable[[], float] = time.monotonic,
        registry: CollectorRegistry | None = None,
        profile: Profile | None = None,
    ) -> None:
        self.settings = settings
        self._artifacts = store
        self._audit = audit
        self._redis = redis
        self._prefix = settings.redis_prefix
        self._clock = clock
        self.metrics = router_metrics(registry)
        self._placement_counters: dict[str, Any] = {}
        if profile is None:
            from router.placement import profile_from_config

            profile = profile_from_config(settings.placement_profile, settings.placement_params)
        self.profile: Profile = profile
        self.snapshot: RoutingSnapshot | None = None
        self._session: aiohttp.ClientSession | None = None
        self._store: ReplicaStore | None = None
        self._loader: Loader | None = None
        self._reconciler: Reconciler | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._running = True
        self._bg: set[asyncio.Task[Any]] = set()
        self._prewarming: set[tuple[str, str]] = set()  # (replica url, lora_name) being prewarmed
        self._timeout = aiohttp.ClientTimeout(
            total=settings.request_timeout_s, connect=settings.connect_timeout_s
        )

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        s = self.settings
        connector = aiohttp.TCPConnector(
            limit=0, limit_per_host=s.max_connections_per_replica, keepalive_timeout=30, ttl_dns_cache=60
        )
        self._session = aiohttp.ClientSession(connector=connector, auto_decompress=False)
        drivers = {
            p.name: make_driver(p.engine, self._session, p.api_key.get_secret_value() if p.api_key else None)
            for p in s.pools
        }
        stagers: dict[str, Stager] = {}
        for p in s.pools:
            if p.staging.mode == "agent":
                stagers[p.name] = AgentStager(
                    p.staging.url_template,
                    p.staging.token.get_secret_value() if p.staging.token else None,
                    self._artifacts,
                    self._session,
                    replica_dir=p.staging.dir,
                    timeout_s=max(s.load_timeout_s, 30.0),
                )
            else:
                stagers[p.name] = LocalStager(p.staging.dir or s.resolved_staging_dir(), self._artifacts)
        self._store = ReplicaStore(
            s, drivers, clock=self._clock, wall=time.time, metrics=self.metrics, on_poll=self._on_poll
        )
        self._loader = Loader(
            s,
            self._store,
            stagers,
            self._audit,
            self.metrics,
            redis=self._redis,
            prefix=self._prefix,
            clock=self._clock,
        )
        self._reconciler = Reconciler(self, self._store, self._loader, clock=self._clock)
        await self._store.start()
        self._tasks.append(asyncio.create_task(self._reconciler.run(), name="reconciler"))
        if self._redis is not None:
            self._tasks.append(asyncio.create_task(self._publish_loop(), name="publish"))
            self._tasks.append(asyncio.create_task(self._prewarm_loop(), name="prewarm"))

    async def stop(self) -> None:
        self._running = False
        if self._reconciler is not None:
            self._reconciler.stopped = True
        await cancel_all([*self._tasks, *self._bg])
        self._tasks.clear()
        if self._loader is not None:
            await self._loader.stop()
        if self._store is not None:
            await self._store.stop()
        if self._session is not None:
            await self._session.close()
            self._session = None

    # ------------------------------------------------------------------ state for others

    @property
    def store(self) -> ReplicaStore:
        if self._store is None:
            raise RuntimeError("Router.start() was not called")
        return self._store

    @property
    def loader(self) -> Loader:
        if self._loader is None:
            raise RuntimeError("Router.start() was not called")
        return self._loader

    def ready(self) -> bool:
        return self._store is not None and self._store.healthy_count() > 0

    def healthy_count(self, base_model: str | None = None) -> int:
        return 0 if self._store is None else self._store.healthy_count(base_model)

    @property
    def directory(self) -> ReplicaDirectory:
        from router.directory import LocalReplicaDirectory

        return LocalReplicaDirectory(self)

    def replica_records(self) -> list[dict[str, Any]]:
        return [] if self._store is None else [self._store.record(r) for r in self._store.replicas.values()]

    def update_snapshot(self, snapshot: RoutingSnapshot) -> None:
        """Called on every registry revision; the reconciler acts on it within moments."""
        self.snapshot = snapshot
        if self._reconciler is not None:
            self._reconciler.kick()

    def _on_poll(self, rep: ReplicaState, models: ModelsInfo | None) -> None:
        if self._loader is None or models is None or self._redis is None:
            return
        # Clear shared "resident" records of adapters the replica no longer lists (it restarted).
        self._spawn(self._loader.forget_missing(rep.url, set(models.adapters), rep.poll_started_wall))

    def _spawn(self, coro: Any) -> None:
        task = asyncio.create_task(coro)
        self._bg.add(task)
        task.add_done_callback(self._bg.discard)

    # ------------------------------------------------------------------ forwarding

    async def forward(self, req: ForwardRequest) -> ForwardResult:
        t0 = self._clock()
        version = req.version
        store = self.store
        if not store.for_base(req.base_model):
            raise NoCapacity(f"no replicas serve base model {req.base_model}", retry_after=5)
        if version is not None:
            self.loader.note_request(version.lora_name)
        excluded: set[str] = set()
        cold = False
        last: Exception | None = None
        for attempt in range(2):
            rep = await self._place(req, excluded)
            try:
                if version is not None:
                    cold = await self.loader.ensure_loaded(rep, version) or cold
                return await self._send(rep, req, cold, self._clock() - t0)
            except LoadError as exc:
                last = exc
                if not exc.retry_elsewhere:
                    break
                excluded.add(rep.url)
            except Retryable as exc:
                last = exc
                if exc.replica_down:  # connection refused: out of rotation until a poll succeeds
                    store.mark_failure(rep, exc.message, immediate=True)
                if exc.adapter_missing and version is not None:
                    # The replica lost the adapter (restart): forget it, reload on the retry.
                    rep.residents.pop(version.lora_name, None)
                    await self.loader.forget(rep.url, version.lora_name)
                elif any(
                    r.healthy and r.url != rep.url and r.url not in excluded
                    for r in store.for_base(req.base_model)
                ):
                    excluded.add(rep.url)  # else: retry the same one (e.g. a stale pooled connection)
            log.info(
                "retrying on another replica",
                extra={
                    "request_id": req.request_id,
                    "replica": rep.url,
                    "error": str(last),
                    "attempt": attempt,
                },
            )
        if isinstance(last, LoadError):
            raise AdapterLoadFailed(
                f"adapter {req.client_model} could not be loaded: {last.message}",
                retry_after=5 if last.retry_elsewhere else 30,
            )
        raise UpstreamError(f"replica error: {last}")

    async def _place(self, req: ForwardRequest, excluded: set[str]) -> ReplicaState:
        store = self.store
        reps = [r for r in store.for_base(req.base_model) if r.healthy and r.url not in excluded]
        if not reps:
            raise NoCapacity(f"no healthy replica for base model {req.base_model}", retry_after=2)
        version = req.version
        body = req.body
        max_tokens = body.get("max_tokens") or body.get("max_completion_tokens") or 0
        preq = PlacementRequest(
            lora_name=version.lora_name if version else None,
            adapter_id=version.adapter_id if version else None,
            size_bytes=version.total_bytes if version else 0,
            max_tokens=max_tokens if isinstance(max_tokens, int) else 0,
            exclude=frozenset(excluded),
        )
        decision: Decision = self.profile.pick(preq, views(reps), self._clock())
        if decision.replica is None:
            raise NoCapacity(f"no capacity for {req.client_model}: {decision.reason or 'all replicas busy'}")
        rep = store.replicas.get(decision.replica)
        if rep is None:
            raise NoCapacity("placement chose an unknown replica")
        outcome = decision.action if decision.action != "none" else "hit"
        counter = self._placement_counters.get(outcome)
        if counter is None:  # the labelled child, looked up once per outcome (labels() is slow)
            counter = self._placement_counters[outcome] = self.metrics.placement.labels(outcome=outcome)
        counter.inc()
        if version is not None and decision.action in ("load", "replicate"):
            await self._make_room(rep, version, decision.evict)
        return rep

    async def _make_room(
        self,
        rep: ReplicaState,
        version: VersionInfo,
        evict: tuple[str, ...],
        *,
        keep_hot_copies: bool = False,
    ) -> bool:
        """Unload what placement listed; if still at max_adapters, the LRU idle one.

        A listed victim whose eviction would drop a hot version below its count (see
        ``Reconciler.keeps_hot_copy``) is swapped for another idle adapter of the replica when
        there is one; else it is evicted anyway, unless ``keep_hot_copies`` (a hot prewarm):
        then nothing is evicted and False is returned (no room made)."""
        name = version.lora_name
        if name in rep.residents:
            return True  # already (being) loaded there
        victims = [v for v in evict if v != name]
        present = [r for n, r in rep.residents.items() if r.state != "failed" and n != name]
        if not victims and len(present) >= rep.pool.max_adapters:
            idle = sorted(
                (r for r in present if r.inflight == 0 and r.state == "resident"),
                key=lambda r: (self._keeps_hot_copy(rep, r.lora_name), r.last_used),
            )
            victims = [r.lora_name for r in idle[: len(present) - rep.pool.max_adapters + 1]]
        spared = self._spare_hot_copies(rep, victims, strict=keep_hot_copies)
        if spared is None:
            return False
        if keep_hot_copies:  # a hot prewarm never goes over max_adapters (others may be loading)
            freed = sum(
                1 for v in spared if (r := rep.residents.get(v)) and r.state == "resident" and r.inflight == 0
            )
            if len(present) - freed >= rep.pool.max_adapters:
                return False
        for victim in spared:
            r = rep.residents.get(victim)
            if r is None or r.inflight > 0:
                continue
            self.metrics.placement.labels(outcome="evict").inc()
            await self.loader.unload(rep, victim, "evict")
        return True

    def _keeps_hot_copy(self, rep: ReplicaState, lora_name: str) -> bool:
        rec = self._reconciler
        return rec is not None and rec.keeps_hot_copy(lora_name, rep.pool.base_model)

    def _spare_hot_copies(self, rep: ReplicaState, victims: list[str], *, strict: bool) -> list[str] | None:
        """``victims`` with each hot copy that must stay replaced by another idle resident of
        ``rep`` (least recently used first); None when ``strict`` and one cannot be replaced."""
        keep = [v for v in victims if self._keeps_hot_copy(rep, v)]
        if not keep:
            return victims
        idle = [r for n, r in rep.residents.items() if r.state == "resident" and r.inflight == 0]
        spare = sorted(
            (r for r in idle if r.lora_name not in victims and not self._keeps_hot_copy(rep, r.lora_name)),
            key=lambda r: r.last_used,
        )
        out = [v for v in victims if v not in keep]
        for v in keep:
            if spare:
                out.append(spare.pop(0).lora_name)
            elif strict:
                return None
            else:
                out.append(v)  # serving this request wins; the reconciler prewarms it again
        return out

    async def _send(
        self, rep: ReplicaState, req: ForwardRequest, cold: bool, queue_s: float
    ) -> ForwardResult:
        assert self._session is not None
        version = req.version
        pool = rep.pool
        model = rep.driver.request_model(version.lora_name if version else None, pool.served_name)
        body = dict(req.body)
        body["model"] = model
        if req.stream and req.want_usage:
            opts = body.get("stream_options")
            body["stream_options"] = {**(opts if isinstance(opts, dict) else {}), "include_usage": True}
        headers = {
            "Content-Type": "application/json",
            "X-Request-Id": req.request_id,
            **rep.driver.auth_headers(),
        }
        resident = rep.residents.get(version.lora_name) if version is not None else None
        now = self._clock()
        rep.inflight += 1
        if resident is not None:
            resident.inflight += 1
            resident.last_used = now
        ended = False

        def end() -> None:
            nonlocal ended
            if ended:
                return
            ended = True
            rep.inflight -= 1
            if resident is not None:
                resident.inflight -= 1
                resident.last_used = self._clock()

        try:
            resp = await open_upstream(
                self._session, f"{rep.url}/v1/{req.endpoint}", orjson.dumps(body), headers, self._timeout
            )
        except BaseException:
            end()
            raise
        try:
            status = resp.status
            if status >= 500:
                text = await resp.read()
                resp.release()
                raise Retryable(f"replica answered HTTP {status}: {text[:200]!r}")
            if status == 404 and version is not None:
                text = await resp.read()
                resp.release()
                raise Retryable(f"replica does not know {model}", adapter_missing=True)
            rewriter = make_rewriter(model, req.client_model)
            out_headers = {"content-type": resp.headers.get("Content-Type", "application/json")}
            result = ForwardResult(
                status=status, headers=out_headers, replica=rep.url, cold_load=cold, queue_s=queue_s
            )

            async def on_wrong(got: bytes) -> None:
                await self._wrong_adapter(rep, req, model, got)

            if req.stream and status == 200:
                relay = StreamRelay(
                    resp,
                    rewriter,
                    result,
                    client_wants_usage=req.client_wants_usage,
                    on_wrong=on_wrong,
                    on_end=end,
                )
                try:
                    first = await relay.first()
                except BaseException:
                    resp.close()
                    raise
                result.stream = relay.iterate(first)
                return result
            data = await read_body(resp)
            resp.release()
            if status == 200:
                data, wrong = rewriter.rewrite(data)
                if wrong is not None:
                    await on_wrong(wrong)
                    raise WrongAdapter(f"replica answered for model {wrong.decode(errors='replace')!r}")
                result.usage = parse_usage(data)
            result.body = data
            end()
            return result
        except BaseException:
            end()
            if not resp.closed:
                resp.close()
            raise

    async def _wrong_adapter(self, rep: ReplicaState, req: ForwardRequest, asked: str, got: bytes) -> None:
        self.metrics.wrong_adapter.labels(replica=rep.url).inc()
        got_s = got.decode(errors="replace")[:200]
        log.error(
            "replica answered with the wrong adapter",
            extra={"replica": rep.url, "asked": asked, "answered": got_s, "request_id": req.request_id},
        )
        version = req.version
        try:
            await self._audit.record(
                actor=ACTOR,
                action="adapter.wrong_adapter",
                subject_type="adapter",
                subject_id=version.adapter_id if version else req.base_model,
                details={
                    "version": version.version if version else None,
                    "replica": rep.url,
                    "asked": asked,
                    "answered": got_s,
                    "request_id": req.request_id,
                },
            )
        except Exception as exc:
            log.warning("audit record failed", extra={"error": str(exc)})

    # ------------------------------------------------------------------ prewarm

    def find_version(self, adapter_id: str, version: str) -> VersionInfo | None:
        snap = self.snapshot
        if snap is None:
            return None
        adapter = snap.adapters.get(adapter_id)
        return adapter.versions.get(version) if adapter else None

    async def request_prewarm(self, adapter_id: str, version: str, replicas: int) -> dict[str, Any]:
        """Start loading ``adapter_id``/``version`` onto ``replicas`` healthy replicas (in the background)."""
        info = self.find_version(adapter_id, version)
        if info is None:
            raise RouterError(f"unknown version {adapter_id} {version}", retry_after=None)
        targets = await self.prewarm(info, replicas)
        return {
            "adapter_id": adapter_id,
            "version": version,
            "lora_name": info.lora_name,
            "replicas": targets,
        }

    async def prewarm(
        self,
        info: VersionInfo,
        replicas: int,
        *,
        exclude: set[str] | frozenset[str] = frozenset(),
        keep_hot_copies: bool = False,
    ) -> list[str]:
        """Have ``info`` on ``replicas`` healthy replicas: those that hold it, then placement's
        picks (never one in ``exclude``), each loaded in the background. ``keep_hot_copies``: a
        load that would have to evict a copy a hot version needs is skipped (the reconciler's
        hot prewarm, so hot adapters never evict each other)."""
        store = self.store
        name = info.lora_name
        reps = [r for r in store.for_base(info.base_model) if r.healthy]
        have = [
            r.url
            for r in reps
            if (name in r.residents and r.residents[name].state != "failed")
            or (r.url, name) in self._prewarming
        ]
        targets = list(have[:replicas])
        excluded = set(have) | set(exclude)
        while len(targets) < replicas:
            cands = [r for r in reps if r.url not in excluded]
            if not cands:
                break
            preq = PlacementRequest(
                lora_name=name,
                adapter_id=info.adapter_id,
                size_bytes=info.total_bytes,
                exclude=frozenset(excluded),
            )
            d = self.profile.pick(preq, views(cands), self._clock())
            if d.replica is None or d.replica not in store.replicas:
                break
            rep = store.replicas[d.replica]
            excluded.add(rep.url)
            targets.append(rep.url)
            self._prewarming.add((rep.url, name))
            self._spawn(self._prewarm_one(rep, info, d.evict, keep_hot_copies))
        return targets

    async def _prewarm_one(
        self, rep: ReplicaState, info: VersionInfo, evict: tuple[str, ...], keep_hot_copies: bool = False
    ) -> None:
        try:
            try:
                if not await self._make_room(rep, info, evict, keep_hot_copies=keep_hot_copies):
                    log.debug(
                        "hot prewarm skipped: no room without evicting another hot copy",
                        extra={"replica": rep.url, "lora_name": info.lora_name},
                    )
                    return
                task = self.loader.start_load(rep, info)  # recorded as staging from here on
            finally:
                self._prewarming.discard((rep.url, info.lora_name))
            await task
        except (LoadError, RouterError) as exc:
            log.warning(
                "prewarm failed", extra={"replica": rep.url, "lora_name": info.lora_name, "error": str(exc)}
            )

    # ------------------------------------------------------------------ Redis publication

    async def _publish_loop(self) -> None:
        from router.directory import publish_records

        assert self._redis is not None
        while self._running:
            try:
                await publish_records(
                    self._redis, self._prefix, self.replica_records(), self.settings.state_ttl_s
                )
            except RedisError as exc:
                log.warning("cannot publish replica state: %s", exc, extra={"error": str(exc)})
            await asyncio.sleep(self.settings.publish_interval_s)

    async def _prewarm_loop(self) -> None:
        from router.directory import pop_prewarm_requests

        assert self._redis is not None
        while self._running:
            try:
                for item in await pop_prewarm_requests(self._redis, self._prefix):
                    with contextlib.suppress(RouterError, KeyError, TypeError, ValueError):
                        await self.request_prewarm(
                            str(item["adapter_id"]), str(item["version"]), int(item["replicas"])
                        )
            except RedisError as exc:
                log.warning("cannot read prewarm requests: %s", exc, extra={"error": str(exc)})
            await asyncio.sleep(0.25)
