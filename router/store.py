"""Replica store: one poll loop per replica, router-owned residency, views for placement.

Each replica is polled every ``poll_interval_s`` (``/health``, ``/v1/models``, ``/metrics``, all
under one ``poll_timeout_s``). After ``unhealthy_after`` failed polls it leaves rotation; one
good poll brings it back. Only transitions are logged.

Residency is the router's own record per (replica, lora_name): ``staging`` → ``loading`` →
``resident`` → ``unloading`` (or ``failed``). Every poll reconciles it with ``/v1/models``: a
resident adapter missing there (replica restarted) is dropped; an unknown lora_name that is
ours (``ADAPTER@vN-sha8``) is adopted as resident (loaded by another gateway process).
Readers get copies (``ReplicaView``s), never the mutable state.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import socket
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from kit.aio import cancel_all
from router.drivers import DriverError, EngineDriver, MetricsSample, ModelsInfo
from router.metrics import RouterMetrics
from router.placement.types import ReplicaView, ResidencyState, Resident
from router.settings import PoolConfig, RouterSettings

log = logging.getLogger("loraplane.router.store")

LORA_NAME_RE = re.compile(
    r"^(?P<adapter>[a-z0-9][a-z0-9._-]{0,62})@(?P<version>v[1-9][0-9]{0,8})-(?P<sha>[0-9a-f]{8})$"
)


def parse_lora_name(name: str) -> tuple[str, str] | None:
    """``"acme@v3-1a2b3c4d"`` → ``("acme", "v3")``; None when the name is not one of ours."""
    m = LORA_NAME_RE.match(name)
    if not m or ".." in m.group("adapter"):
        return None
    return m.group("adapter"), m.group("version")


@dataclass(slots=True)
class Residency:
    lora_name: str
    adapter_id: str
    version: str
    state: ResidencyState
    since: float
    last_used: float
    inflight: int = 0  # this process's requests in flight (or waiting for the load) there
    remote_inflight: int = 0  # other live gateway processes using it there (cluster marks)
    requests: int = 0  # requests this process routed to the adapter (kept across its evictions)
    size_bytes: int = 0
    reason: str = ""
    # The replica whose ``residents`` holds this record (set on insertion): any change of a
    # field drops that replica's cached view.
    owner: ReplicaState | None = field(default=None, repr=False, compare=False)
    _snap: Resident | None = field(default=None, init=False, repr=False, compare=False)

    def __setattr__(self, name: str, value: Any) -> None:
        object.__setattr__(self, name, value)
        if name != "owner" and name != "_snap":
            object.__setattr__(self, "_snap", None)
            owner = getattr(self, "owner", None)  # unset while __init__ runs
            if owner is not None:
                owner.drop_view()

    def snapshot(self) -> Resident:
        """The placement layer's immutable copy of this record (cached until a field changes)."""
        snap = self._snap
        if snap is None:
            snap = Resident(
                lora_name=self.lora_name,
                adapter_id=self.adapter_id,
                state=self.state,
                last_used=self.last_used,
                inflight=self.inflight + self.remote_inflight,
                size_bytes=self.size_bytes,
                requests=self.requests,
            )
            object.__setattr__(self, "_snap", snap)
        return snap


class Residents(dict[str, Residency]):
    """A replica's residency records; every change drops the replica's cached view."""

    __slots__ = ("_owner",)

    def __init__(self, owner: ReplicaState) -> None:
        super().__init__()
        self._owner = owner

    def _changed(self) -> None:
        self._owner.drop_view()

    def __setitem__(self, name: str, r: Residency) -> None:
        r.owner = self._owner
        super().__setitem__(name, r)
        self._changed()

    def __delitem__(self, name: str) -> None:
        super().__delitem__(name)
        self._changed()

    def pop(self, name: str, *default: Any) -> Any:  # type: ignore[override]
        out = super().pop(name, *default)
        self._changed()
        return out

    def popitem(self) -> tuple[str, Residency]:
        out = super().popitem()
        self._changed()
        return out

    def clear(self) -> None:
        super().clear()
        self._changed()

    def setdefault(self, name: str, default: Residency) -> Residency:  # type: ignore[override]
        if name not in self:
            self[name] = default
        return self[name]

    def update(self, *args: Any, **kw: Any) -> None:
        for name, r in dict(*args, **kw).items():
            self[name] = r


# ReplicaState fields a ReplicaView is built from: setting one drops the cached view.
_VIEW_FIELDS = frozenset({"healthy", "metrics", "residents", "inflight", "pool", "url"})


@dataclass(slots=True)
class ReplicaState:
    """Mutable state of one replica; only the store and the router runtime change it.

    ``view()`` is cached until something it is built from changes (a field in ``_VIEW_FIELDS``, a
    residency record or the ``residents`` mapping), so a placement decision over many replicas
    copies only the replicas that changed since the last one (and placement's per-view memos of
    derived facts survive between decisions). Each such change also adds the replica's url to
    ``feed`` (the store's ``changes``), so the planner's placement index updates only those.
    """

    # Declared first: assigned before the fields below, whose assignment reports to it.
    feed: set[str] | None = field(default=None, init=False, repr=False, compare=False)
    seq: int = field(default=0, init=False, compare=False)  # the store's order of replicas
    url: str
    pool: PoolConfig
    driver: EngineDriver
    healthy: bool = False
    failures: int = 0
    last_seen: float | None = None  # clock time of the last good poll
    last_seen_wall: float | None = None
    metrics: MetricsSample = field(default_factory=MetricsSample)
    base_names: tuple[str, ...] = ()
    residents: dict[str, Residency] = field(default_factory=dict)
    inflight: int = 0
    poll_started_wall: float = 0.0  # wall time the last completed poll asked its questions
    polled: asyncio.Event = field(default_factory=asyncio.Event)
    # passive outlier detection: consecutive failed requests/loads; out of rotation until then
    consecutive_failures: int = 0
    failed_models: set[str] = field(default_factory=set)  # what those failures were for ("*": the replica)
    ejected_until: float = 0.0
    # failed loads in a row (requests served there in between do not reset it) and of what; no
    # new adapter is placed there until loads_paused_until (``ReplicaStore.note_load``)
    load_failures: int = 0
    load_failed_models: set[str] = field(default_factory=set)
    loads_paused_until: float = 0.0
    # requests sent here still waiting for their first byte (aborted when the replica is ejected)
    pending: set[asyncio.Task[Any]] = field(default_factory=set)
    aborted: set[asyncio.Task[Any]] = field(default_factory=set)
    _view: ReplicaView | None = field(default=None, init=False, repr=False, compare=False)

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "residents" and not isinstance(value, Residents):
            rs = Residents(self)
            rs.update(value)
            value = rs
        object.__setattr__(self, name, value)
        if name in _VIEW_FIELDS:
            self.drop_view()

    def drop_view(self) -> None:
        """Forget the cached view (something it is built from changed) and report the change."""
        object.__setattr__(self, "_view", None)
        feed = self.feed
        if feed is not None:
            feed.add(self.url)

    @property
    def host(self) -> str:
        return urlsplit(self.url).hostname or "127.0.0.1"

    def view(self) -> ReplicaView:
        """An immutable snapshot for placement (cached until the state changes)."""
        cached = self._view
        if cached is not None:
            return cached
        residents = {n: r.snapshot() for n, r in self.residents.items()}
        m = self.metrics
        view = ReplicaView(
            url=self.url,
            pool=self.pool.name,
            healthy=self.healthy,
            max_loras=self.pool.max_loras,
            max_adapters=self.pool.evict_bound,
            residents=residents,
            inflight=self.inflight,
            running=m.running,
            waiting=m.waiting,
            kv_cache_usage=m.kv_cache_usage,
            lora_running=m.lora_running,
            lora_waiting=m.lora_waiting,
        )
        object.__setattr__(self, "_view", view)
        return view


def views(replicas: list[ReplicaState]) -> list[ReplicaView]:
    """The placement views of ``replicas`` (cached ones as they are; rebuilt where stale)."""
    return [r._view or r.view() for r in replicas]


class ReplicaStore:
    """Knows every replica of every pool; runs the poll loops."""

    def __init__(
        self,
        settings: RouterSettings,
        drivers: dict[str, EngineDriver],
        *,
        clock: Callable[[], float],
        wall: Callable[[], float],
        metrics: RouterMetrics,
        on_poll: Callable[[ReplicaState, ModelsInfo | None], None] | None = None,
    ) -> None:
        self._settings = settings
        self._drivers = drivers
        self._clock = clock
        self._wall = wall
        self._metrics = metrics
        self._on_poll = on_poll
        self.replicas: dict[str, ReplicaState] = {}
        self._loads_paused_until = 0.0  # the latest end of a replica's load pause (note_load)
        # urls of the replicas whose placement view changed (or that were added or removed) since
        # the last take_changes(): the planner's placement index updates only those.
        self.changes: set[str] = set()
        self._seq = 0
        # lora_name → requests counted on records since unloaded (the evictor's frequency)
        self.past_requests: dict[str, int] = {}
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._dns_tasks: list[asyncio.Task[None]] = []
        # (url, lora_name) → when it was unloaded or found missing there (see ``note_gone``)
        self._gone: dict[tuple[str, str], float] = {}
        self._stopped = False

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        for pool in self._settings.pools:
            for url in pool.urls:
                self.add(url, pool)
            if pool.dns:
                await self._resolve_pool(pool)
                self._dns_tasks.append(asyncio.create_task(self._dns_loop(pool), name=f"dns:{pool.name}"))
        # Wait (bounded) for the first poll of every replica so the router starts warm.
        waits = [r.polled.wait() for r in self.replicas.values()]
        if waits:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.gather(*waits), self._settings.poll_timeout_s + 0.5)

    async def stop(self) -> None:
        self._stopped = True
        tasks = [*self._tasks.values(), *self._dns_tasks]
        await cancel_all(tasks)
        self._tasks.clear()
        self._dns_tasks.clear()

    def add(self, url: str, pool: PoolConfig, *, poll: bool = True) -> ReplicaState:
        """Add a replica (``poll=False``: no poll loop, for benchmarks and tests)."""
        url = url.rstrip("/")
        if url in self.replicas:
            return self.replicas[url]
        rep = ReplicaState(url=url, pool=pool, driver=self._drivers[pool.name])
        self._seq += 1
        rep.seq = self._seq  # the order of store.replicas (a url added again goes last)
        rep.feed = self.changes
        self.replicas[url] = rep
        self.changes.add(url)
        if poll and not self._stopped:
            self._tasks[url] = asyncio.create_task(self._poll_loop(rep), name=f"poll:{url}")
        log.info("replica added", extra={"replica": url, "pool": pool.name})
        return rep

    def remove(self, url: str) -> None:
        rep = self.replicas.pop(url, None)
        if rep is not None:
            rep.feed = None
            self.changes.add(url)
        task = self._tasks.pop(url, None)
        if task:
            task.cancel()
        if rep:
            log.info("replica removed", extra={"replica": url, "pool": rep.pool.name})
            self._update_gauge(rep.pool.name)

    # ------------------------------------------------------------------ DNS

    async def _resolve_pool(self, pool: PoolConfig) -> None:
        assert pool.dns
        host, _, port_s = pool.dns.rpartition(":")
        port = int(port_s)
        try:
            infos = await asyncio.get_running_loop().getaddrinfo(
                host, port, family=socket.AF_INET, type=socket.SOCK_STREAM
            )
        except OSError as exc:
            log.warning(
                "dns resolution failed", extra={"pool": pool.name, "dns": pool.dns, "error": str(exc)}
            )
            return
        wanted = {f"http://{info[4][0]}:{port}" for info in infos}
        current = {u for u, r in self.replicas.items() if r.pool.name == pool.name}
        for url in sorted(wanted - current):
            self.add(url, pool)
        for url in sorted(current - wanted):
            self.remove(url)

    async def _dns_loop(self, pool: PoolConfig) -> None:
        while not self._stopped:
            await asyncio.sleep(pool.dns_interval_s)
            await self._resolve_pool(pool)

    # ------------------------------------------------------------------ polling

    async def _poll_loop(self, rep: ReplicaState) -> None:
        # The flag also ends the loop if a cancellation is swallowed (asyncio.wait_for in 3.11).
        while not self._stopped and self.replicas.get(rep.url) is rep:
            try:
                await self.poll_once(rep)
            except asyncio.CancelledError:
                raise
            except Exception:  # never let one bad poll kill the loop
                log.exception("replica poll crashed", extra={"replica": rep.url})
            await asyncio.sleep(self._settings.poll_interval_s)

    async def _fetch(self, rep: ReplicaState) -> tuple[bool, ModelsInfo, MetricsSample]:
        t = self._settings.poll_timeout_s
        drv = rep.driver
        healthy, models, text = await asyncio.gather(
            drv.health(rep.url, t), drv.list_adapters(rep.url, t), drv.metrics_text(rep.url, t)
        )
        return healthy, models, drv.parse_metrics(text)

    async def poll_once(self, rep: ReplicaState) -> None:
        """One poll: health, models and metrics under one timeout; then reconcile residency."""
        models: ModelsInfo | None = None
        ok = False
        error = ""
        started = self._clock()
        started_wall = self._wall()
        try:
            healthy, models, sample = await asyncio.wait_for(self._fetch(rep), self._settings.poll_timeout_s)
            ok = healthy
            if not healthy:
                error = "health check failed"
        except (DriverError, TimeoutError) as exc:
            error = str(exc) or type(exc).__name__
        if ok and models is not None:
            if rep.metrics != sample:  # an unchanged sample keeps the cached placement view
                rep.metrics = sample
            rep.base_names = models.base_names
            rep.failures = 0
            rep.last_seen = self._clock()
            rep.last_seen_wall = self._wall()
            rep.poll_started_wall = started_wall
            if not rep.healthy and self._clock() >= rep.ejected_until:
                rep.healthy = True
                log.info("replica healthy", extra={"replica": rep.url, "pool": rep.pool.name})
                self._update_gauge(rep.pool.name)
            if rep.driver.capabilities.lists_adapters:  # else our records are the (advisory) ledger
                self.reconcile(rep, models, started)
        else:
            self.mark_failure(rep, error)
        rep.polled.set()
        if self._on_poll is not None:
            self._on_poll(rep, models if ok else None)

    def mark_failure(self, rep: ReplicaState, error: str, *, immediate: bool = False) -> None:
        """Count a failed check; out of rotation after ``unhealthy_after`` (at once if ``immediate``).
        Requests still waiting for the replica's first byte are aborted (retried elsewhere)."""
        rep.failures += 1
        if rep.healthy and (immediate or rep.failures >= self._settings.unhealthy_after):
            rep.healthy = False
            log.warning(
                "replica out of rotation: %s",
                error,
                extra={"replica": rep.url, "pool": rep.pool.name, "error": error, "failures": rep.failures},
            )
            self._update_gauge(rep.pool.name)
            for task in rep.pending:
                rep.aborted.add(task)
                task.cancel()

    def note_gone(self, rep: ReplicaState, lora_name: str) -> None:
        """``lora_name`` left ``rep`` (unloaded, or the replica said it does not know it): a poll
        answer asked before now must not bring it back as resident (it may predate the unload)."""
        now = self._clock()
        self._gone[(rep.url, lora_name)] = now
        if len(self._gone) > 4096:
            self._gone = {k: t for k, t in self._gone.items() if now - t < 120.0}

    def note_success(self, rep: ReplicaState) -> None:
        """A request or load succeeded there: the outlier count starts again."""
        if rep.consecutive_failures:
            rep.consecutive_failures = 0
            rep.failed_models.clear()

    def note_failure(self, rep: ReplicaState, error: str, model: str | None = None) -> None:
        """A request or load failed there; after ``outlier_failures`` in a row the replica leaves
        rotation for at least ``outlier_cooloff_s`` (passive outlier detection) — when the failures
        are the replica's: a connection or first-byte failure (``model`` None), or answers for at
        least two different models. One adapter that keeps failing (a bad version, a canary's
        errors) does not take the replica away from every other adapter."""
        rep.consecutive_failures += 1
        rep.failed_models.add(model or "*")
        if rep.consecutive_failures >= self._settings.outlier_failures and (
            "*" in rep.failed_models or len(rep.failed_models) >= 2
        ):
            rep.consecutive_failures = 0
            rep.failed_models.clear()
            rep.ejected_until = self._clock() + self._settings.outlier_cooloff_s
            self.mark_failure(
                rep, f"{self._settings.outlier_failures} failures in a row, last: {error}", immediate=True
            )

    def note_load(self, rep: ReplicaState, model: str, *, ok: bool, error: str = "") -> None:
        """A load there succeeded or failed. After ``outlier_failures`` failed loads in a row, of
        at least two adapters, no new adapter is placed there for ``outlier_cooloff_s``
        (:meth:`load_targets`); what it holds keeps serving. Unlike :meth:`note_failure`, the
        requests it serves meanwhile do not reset the count: a replica that serves its adapters
        but refuses every load is still found under traffic."""
        if ok:
            rep.load_failures = 0
            rep.load_failed_models.clear()
            return
        rep.load_failures += 1
        rep.load_failed_models.add(model)
        if rep.load_failures >= self._settings.outlier_failures and len(rep.load_failed_models) >= 2:
            rep.load_failures = 0
            rep.load_failed_models.clear()
            rep.loads_paused_until = self._clock() + self._settings.outlier_cooloff_s
            self._loads_paused_until = max(self._loads_paused_until, rep.loads_paused_until)
            log.warning(
                "replica refuses loads: no new adapters placed there for a while",
                extra={"replica": rep.url, "cooloff_s": self._settings.outlier_cooloff_s, "error": error},
            )

    def load_targets(self, reps: list[ReplicaState], lora_name: str) -> list[ReplicaState]:
        """``reps`` less those whose loads are paused (:meth:`note_load`) unless ``lora_name`` is
        there already; all of ``reps`` when that would leave none."""
        now = self._clock()
        if now >= self._loads_paused_until:  # no replica's loads are paused (the usual case)
            return reps
        out = [
            r
            for r in reps
            if now >= r.loads_paused_until
            or ((x := r.residents.get(lora_name)) is not None and x.state != "failed")
        ]
        return out or reps

    def load_exclusions(self, base_model: str, lora_name: str, excluded: set[str]) -> set[str]:
        """``excluded`` plus the healthy replicas of ``base_model`` that :meth:`load_targets`
        leaves out for ``lora_name`` (``excluded`` itself when there are none)."""
        if self._clock() >= self._loads_paused_until:
            return excluded
        reps = [r for r in self.for_base(base_model) if r.healthy and r.url not in excluded]
        keep = {r.url for r in self.load_targets(reps, lora_name)}
        paused = {r.url for r in reps if r.url not in keep}
        return excluded | paused if paused else excluded

    def reconcile(self, rep: ReplicaState, models: ModelsInfo, asked_at: float | None = None) -> None:
        """Align residency with what the replica said (at ``asked_at``) it has registered.

        Records that changed after the question was asked (a load finished meanwhile) are kept.
        """
        now = self._clock()
        asked = now if asked_at is None else asked_at
        listed = models.adapters
        for name in list(rep.residents):
            r = rep.residents[name]
            if r.state == "resident" and name not in listed and r.since <= asked:
                log.info(
                    "adapter vanished from replica",
                    extra={"replica": rep.url, "lora_name": name},
                )
                del rep.residents[name]
            elif r.state == "failed" and now - r.since > 30.0:
                del rep.residents[name]
        for name in listed:
            r2 = rep.residents.get(name)
            if r2 is not None and r2.state != "failed":
                continue
            if r2 is None and self._gone.get((rep.url, name), float("-inf")) >= asked:
                continue  # unloaded after the question was asked: a stale answer
            parsed = parse_lora_name(name)
            if parsed is None:
                continue
            rep.residents[name] = Residency(
                lora_name=name,
                adapter_id=parsed[0],
                version=parsed[1],
                state="resident",
                since=now,
                last_used=now,
            )

    def _update_gauge(self, pool: str) -> None:
        n = sum(1 for r in self.replicas.values() if r.pool.name == pool and r.healthy)
        self._metrics.replicas_healthy.labels(pool=pool).set(n)

    # ------------------------------------------------------------------ readers

    def for_base(self, base_model: str) -> list[ReplicaState]:
        return [r for r in self.replicas.values() if r.pool.base_model == base_model]

    def serves(self, base_model: str) -> bool:
        """Whether any replica serves ``base_model`` (stops at the first: no list per request)."""
        return any(r.pool.base_model == base_model for r in self.replicas.values())

    def pools_for(self, base_model: str) -> list[PoolConfig]:
        """The configured pools serving ``base_model``."""
        return [p for p in self._settings.pools if p.base_model == base_model]

    def take_changes(self) -> set[str]:
        """The urls in ``changes`` (emptied): replicas added, removed or with a new view since."""
        out = set(self.changes)
        self.changes.clear()
        return out

    def healthy_count(self, base_model: str | None = None) -> int:
        return sum(
            1
            for r in self.replicas.values()
            if r.healthy and (base_model is None or r.pool.base_model == base_model)
        )

    def record(self, rep: ReplicaState) -> dict[str, Any]:
        """The replica record of SPEC §13."""
        import datetime as _dt

        last_seen = (
            _dt.datetime.fromtimestamp(rep.last_seen_wall, tz=_dt.UTC).isoformat().replace("+00:00", "Z")
            if rep.last_seen_wall
            else None
        )
        return {
            "url": rep.url,
            "pool": rep.pool.name,
            "base_model": rep.pool.base_model,
            "healthy": rep.healthy,
            "adapters": [
                {"adapter": r.adapter_id, "version": r.version, "lora_name": r.lora_name, "state": r.state}
                for r in rep.residents.values()
            ],
            "running": rep.metrics.running,
            "waiting": rep.metrics.waiting,
            "inflight": rep.inflight,
            "last_seen": last_seen,
        }
