"""The routing table: the registry's snapshot as the gateway sees it, kept fresh change by change.

``RoutingTable(loader, feed=..., apply_changes=..., on_snapshot=...)`` loads the whole snapshot
at start (``loader`` is a blocking callable, run on a thread of its own; ``load_async``, when
given, is awaited instead: PostgreSQL builds it on the loop in slices), then follows the
change feed: each ``Change(revision, subjects)`` is queued, and the table applies the queued
run of consecutive revisions with one ``await apply_changes(snapshot, subjects, revision)``
call (``gateway.snapshot_source``), which reads only those subjects' rows and returns a new
snapshot sharing everything else.
Changes that arrive while one is applied are batched into the next call, and while changes
keep coming the table applies at most once per ``batch_window_s`` (a change after a quiet spell
is applied at once), so a burst of 1,000 changes becomes a few batched loads and swaps, not
1,000. The whole snapshot is reloaded
instead when a revision is missing (a notice never arrived), after a feed reconnect or a
``*`` change, and when ``apply_changes`` declines (returns None) or is not given.

The safety net, every ``refresh_s``: with ``apply_changes``, one cheap read of the registry's
revision (``apply_changes.revision()``, a single-row SELECT). Equal to the table's: nothing
was missed, the table is confirmed fresh. Newer, and the feed does not bring the table there
within ``NOTICE_GRACE_S`` (the notices may be on their way): a notice was lost — counted
(``missed``) and the whole snapshot reloaded. A whole load runs anyway every ``verify_s``
(default 5 minutes, ± 10 %) and without ``apply_changes`` every ``refresh_s``; it runs *beside* the
change path (a whole load of a large registry takes long; changes keep being applied
meanwhile) and is installed only if nothing newer was applied; a table that differs from it at
the same revision is counted (``drifts``) and replaced. (A whole load every ``refresh_s`` held
the GIL for hundreds of milliseconds on a 1,000-adapter registry and made the propagation
benchmark's tail; see ``benchmarks/README.md``.)

Each new snapshot goes to ``on_snapshot`` (the router's ``update_snapshot``). When the registry
database is unreachable the table keeps serving the last snapshot, marks itself ``stale``
(shown in /readyz), logs once per transition and reloads every ``retry_s`` until it is back.
``age_s()`` is the time since the table last matched the registry (a load, an applied change
or a revision check that found nothing new): the gateway's ``loraplane_snapshot_age_seconds``.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import inspect
import logging
import random
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Protocol, TypeVar

from registry.feed import EVERYTHING, Change
from registry.repositories.state import ALL
from registry.snapshot import RoutingSnapshot

log = logging.getLogger("loraplane.gateway.table")

T = TypeVar("T")
Loader = Callable[[], RoutingSnapshot]
AsyncLoader = Callable[[], Awaitable[RoutingSnapshot]]

NOTICE_GRACE_S = 1.0  # a revision check that finds the table behind waits this long for the feed
REVISION_TIMEOUT_S = 10.0  # default: a revision read that hangs longer counts as a registry failure


class ChangeApplier(Protocol):
    """(current snapshot, changed subjects, the revision they bring it to) → the new snapshot, or
    None: reload the whole snapshot instead (``gateway.snapshot_source``)."""

    async def __call__(
        self, base: RoutingSnapshot, subjects: frozenset[str], revision: int
    ) -> RoutingSnapshot | None: ...

    async def revision(self) -> int:
        """The registry's committed revision: one cheap read (the safety net's check)."""
        ...

    async def aclose(self) -> None: ...


class Feed(Protocol):
    def listen(self) -> AsyncIterator[Change]: ...


class RoutingTable:
    def __init__(
        self,
        loader: Loader,
        *,
        load_async: AsyncLoader | None = None,
        feed: Feed | None = None,
        apply_changes: ChangeApplier | None = None,
        on_snapshot: Callable[[RoutingSnapshot], Any] | None = None,
        refresh_s: float = 15.0,
        verify_s: float = 300.0,
        retry_s: float = 1.0,
        batch_window_s: float = 0.02,
        freeze_gc: bool = False,
        revision_timeout_s: float = REVISION_TIMEOUT_S,
    ) -> None:
        self._loader = loader
        self._load_async = load_async
        self._apply = apply_changes
        self._feed = feed
        self._on_snapshot = on_snapshot
        self._refresh_s = refresh_s
        self._verify_s = max(verify_s, refresh_s)
        self._grace_s = min(NOTICE_GRACE_S, refresh_s)
        self._retry_s = min(retry_s, refresh_s)
        self._batch_window_s = batch_window_s
        self._revision_timeout_s = revision_timeout_s
        self._freeze_gc = freeze_gc
        self._frozen = False
        self._last_apply = -1e9  # time.monotonic() of the last incremental apply
        self.snapshot: RoutingSnapshot | None = None
        self.stale = False  # True while the last registry read failed
        self.last_error: str | None = None
        self.loaded_at: float | None = None  # time.time() of the last successful read
        self._fresh_at = time.monotonic()  # … as monotonic time (since creation until the first)
        self.reloads = 0  # whole-snapshot loads
        self.applies = 0  # incremental applies (each one batch of consecutive changes)
        self.changes_applied = 0  # revisions applied incrementally
        self.gaps = 0  # whole reloads because a revision was missing from the feed
        self.drifts = 0  # safety-net reloads that found the table wrong at the same revision
        self.refreshes = 0  # safety-net loads finished (installed or not)
        self.refreshes_outrun = 0  # … not installed: changes applied meanwhile were newer
        self.revision_checks = 0  # safety-net revision reads (no whole load)
        self.missed = 0  # … that found the table behind with no notice coming: whole reload
        self.changed_at: float | None = None  # time.time() when a new revision was installed
        self.notified_at: float | None = None  # time.time() of the last change-feed notification
        self.load_ms: float | None = None  # how long the last whole load took
        self.apply_ms: float | None = None  # how long the last incremental apply took
        self._pending: dict[int, frozenset[str]] = {}  # revision → subjects, not applied yet
        self._full = False  # a whole reload is due
        self._wanted = asyncio.Event()
        self._lock = asyncio.Lock()
        self._tasks: list[asyncio.Task[None]] = []
        self._changed = asyncio.Condition()
        # A thread of its own: a busy default executor (staging, hashing) must not delay a reload.
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="snapshot-loader")

    @property
    def revision(self) -> int | None:
        return self.snapshot.revision if self.snapshot is not None else None

    async def start(self) -> None:
        """First load (not fatal if the registry is down: the table stays not-ready), then follow."""
        await self.reload()
        self._tasks.append(asyncio.create_task(self._run(), name="table-apply"))
        self._tasks.append(asyncio.create_task(self._refresh_loop(), name="table-refresh"))
        if self._feed is not None:
            self._tasks.append(asyncio.create_task(self._feed_loop(), name="table-feed"))

    async def stop(self) -> None:
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        self._tasks.clear()
        if self._apply is not None:
            await self._apply.aclose()
        self._executor.shutdown(wait=False, cancel_futures=True)

    def notify(self, revision: int | None = None, subjects: frozenset[str] = EVERYTHING) -> None:
        """A change-feed notification: ``revision`` changed ``subjects``; no revision: reload all."""
        self.notified_at = time.time()
        if revision is None:
            self._full = True
        elif self.snapshot is None or revision > self.snapshot.revision or self.stale:
            self._pending[revision] = self._pending.get(revision, frozenset()) | subjects
        else:
            return
        self._wanted.set()

    async def reload(self) -> bool:
        """Load the whole snapshot now; True on success. Never raises (logs transitions)."""
        async with self._lock:
            return await self._reload()

    async def catch_up(self) -> bool:
        """Apply every queued change (whole reloads where needed); False if the registry failed."""
        async with self._lock:
            while True:
                base = self.snapshot
                if base is None or self.stale or self._full:
                    self._full = False
                    if not await self._reload():
                        return False
                    continue
                self._pending = {r: s for r, s in self._pending.items() if r > base.revision}
                if not self._pending:
                    return True
                last, subjects = base.revision, frozenset[str]()
                while last + 1 in self._pending:
                    last += 1
                    subjects |= self._pending[last]
                if last == base.revision:  # the next revision never came: a notice was lost
                    self.gaps += 1
                    log.info(
                        "change feed gap; reloading the routing snapshot", extra={"revision": base.revision}
                    )
                    self._full = True
                    continue
                if ALL in subjects or self._apply is None:
                    self._full = True
                    continue
                hold = self._last_apply + self._batch_window_s - time.monotonic()
                if hold > 0:  # changes keep coming: let this batch grow a little
                    await asyncio.sleep(hold)
                    continue
                t0 = time.perf_counter()
                try:
                    snap = await self._apply(base, subjects, last)
                except Exception as e:  # any registry failure keeps the last snapshot
                    self._failed(e)
                    return False
                if snap is None:  # the applier cannot say: read everything
                    self._full = True
                    continue
                self.apply_ms = round((time.perf_counter() - t0) * 1000, 2)
                self._last_apply = time.monotonic()
                self.applies += 1
                self.changes_applied += last - base.revision
                for r in range(base.revision + 1, last + 1):
                    self._pending.pop(r, None)
                await self._install(snap)

    async def wait_for_revision(self, revision: int, timeout: float) -> bool:
        """Wait until the table holds ``revision`` or later (tests and benchmarks)."""
        async with asyncio.timeout(timeout), self._changed:
            await self._changed.wait_for(lambda: (self.revision or -1) >= revision)
        return True

    def status(self) -> dict[str, Any]:
        """For /readyz."""
        return {
            "loaded": self.snapshot is not None,
            "revision": self.revision,
            "stale": self.stale,
            "last_error": self.last_error,
            "age_s": round(time.time() - self.loaded_at, 3) if self.loaded_at else None,
            "changed_at": self.changed_at,
            "notified_at": self.notified_at,
            "load_ms": self.load_ms,
            "apply_ms": self.apply_ms,
            "reloads": self.reloads,
            "applies": self.applies,
            "changes_applied": self.changes_applied,
            "gaps": self.gaps,
            "drifts": self.drifts,
            "refreshes": self.refreshes,
            "refreshes_outrun": self.refreshes_outrun,
            "revision_checks": self.revision_checks,
            "missed": self.missed,
        }

    def age_s(self) -> float:
        """Seconds since the table last matched the registry (a whole load, an applied change or
        a revision check that found nothing new); before the first load, since it was created.
        Grows while the registry database is unreachable."""
        return max(0.0, time.monotonic() - self._fresh_at)

    # ------------------------------------------------------------------ internals

    async def _in_thread(self, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    def _freeze(self) -> None:
        """Once, after the first whole load (before the gateway serves): move every object alive
        now — the imported modules (~175,000 objects), the router, the first snapshot — out of
        the cyclic collector's reach (``gc.freeze``). A full collection then scans only what came
        later; one over all of them took ~100 ms of CPU with the GIL held on the busy 2-core test
        machine (the longest pause of a whole reload, and of any request it falls on). Once
        only: whatever is alive at a freeze and later becomes cyclic garbage is never collected.
        Snapshots are acyclic, so a replaced one is still freed by reference counting."""
        if self._freeze_gc and not self._frozen:
            self._frozen = True
            gc.freeze()

    async def _load_whole(self) -> RoutingSnapshot:
        if self._load_async is not None:
            return await self._load_async()
        return await self._in_thread(self._loader)

    def _failed(self, e: Exception) -> None:
        self.last_error = f"{type(e).__name__}: {e}"[:500]
        if not self.stale:
            self.stale = True
            log.warning(
                "registry unreachable; serving the last routing snapshot",
                extra={"error": self.last_error, "revision": self.revision},
            )

    async def _reload(self) -> bool:
        t0 = time.perf_counter()
        try:
            snap = await self._load_whole()
        except Exception as e:  # any registry failure keeps the last snapshot
            self._failed(e)
            return False
        self.load_ms = round((time.perf_counter() - t0) * 1000, 2)
        self.reloads += 1
        await self._install(snap)
        self._freeze()
        return True

    def _confirmed(self) -> None:
        """The registry was read and the table matches it now."""
        if self.stale:
            log.warning("registry reachable again", extra={"revision": self.revision})
        self.stale = False
        self.last_error = None
        self.loaded_at = time.time()
        self._fresh_at = time.monotonic()

    async def _install(self, snap: RoutingSnapshot) -> None:
        self.snapshot, previous = snap, self.snapshot
        self._confirmed()
        changed = previous is None or snap.revision != previous.revision
        if not changed:
            return
        self.changed_at = time.time()
        if self._on_snapshot is not None:
            try:
                res = self._on_snapshot(snap)
                if inspect.isawaitable(res):
                    await res
            except Exception:  # the router's problem must not stop the table
                log.exception("router.update_snapshot failed", extra={"revision": snap.revision})
        async with self._changed:
            self._changed.notify_all()

    async def _run(self) -> None:
        while True:
            if self.stale or self.snapshot is None:
                try:
                    async with asyncio.timeout(self._retry_s):
                        await self._wanted.wait()
                except TimeoutError:
                    self._full = True  # retry while the registry is down
            else:
                await self._wanted.wait()
            self._wanted.clear()
            await self.catch_up()

    def _next_verify(self) -> float:
        """When the next whole load is due: ``verify_s`` ± 10 %, so that gateways started together
        (a deploy) do not all load the whole table from the database at the same moment."""
        return time.monotonic() + self._verify_s * random.uniform(0.9, 1.1)

    async def _refresh_loop(self) -> None:
        verify_at = self._next_verify()
        while True:
            await asyncio.sleep(self._refresh_s)
            if self.snapshot is None or self.stale:  # ``_run`` is retrying already
                continue
            if self._apply is None or time.monotonic() >= verify_at:
                verify_at = self._next_verify()
                await self.refresh()
            else:
                await self.check_revision()

    async def check_revision(self) -> None:
        """The cheap safety net: read the registry's revision; if the table is behind and the
        feed does not bring it there within the grace period, a notice was lost: reload."""
        assert self._apply is not None
        try:
            async with asyncio.timeout(self._revision_timeout_s):
                latest = await self._apply.revision()
        except Exception as e:  # any registry failure keeps the last snapshot
            self._failed(e)
            self._wanted.set()  # ``_run`` retries every ``retry_s``
            return
        self.revision_checks += 1
        current = self.revision
        if current is not None and latest <= current:
            if not self._full and not self._pending:
                self._confirmed()
            return
        with contextlib.suppress(TimeoutError):  # notices on their way (or being applied)?
            await self.wait_for_revision(latest, self._grace_s)
            return
        self.missed += 1
        log.warning(
            "routing table behind the registry without a notice; reloading",
            extra={"revision": self.revision, "registry_revision": latest},
        )
        await self.refresh()

    async def refresh(self) -> None:
        """The safety net: load the whole snapshot *without* holding up changes meanwhile, then
        install it unless changes applied during the load are newer. If it differs from the
        table at the same revision, an incremental apply went wrong: say so and replace it."""
        t0 = time.perf_counter()
        try:
            snap = await self._load_whole()
        except Exception as e:  # any registry failure keeps the last snapshot
            self._failed(e)
            self._wanted.set()  # ``_run`` retries every ``retry_s``
            return
        self.refreshes += 1
        async with self._lock:
            current = self.snapshot
            if current is not None and snap.revision < current.revision:
                self.refreshes_outrun += 1  # changes were applied meanwhile; the next one checks again
                return
            if current is not None and snap.revision == current.revision and snap != current:
                self.drifts += 1
                log.warning(
                    "routing table differed from the registry; replaced", extra={"revision": snap.revision}
                )
            self.load_ms = round((time.perf_counter() - t0) * 1000, 2)
            self.reloads += 1
            if current is not None and snap.revision == current.revision and snap == current:
                self._confirmed()  # nothing new: keep the old object (no router update)
                return
            await self._install(snap)
        self._wanted.set()  # apply what queued up behind the load

    async def _feed_loop(self) -> None:
        assert self._feed is not None
        failing = False
        while True:
            try:
                async for change in self._feed.listen():
                    if failing:
                        failing = False
                        log.warning("change feed listening again")
                        self.notify()
                    self.notify(change.revision, change.subjects)
            except asyncio.CancelledError:
                raise
            except Exception as e:  # reconnect forever, log once per transition
                if not failing:
                    failing = True
                    log.warning("change feed failed; retrying", extra={"error": f"{type(e).__name__}: {e}"})
            await asyncio.sleep(self._retry_s)
