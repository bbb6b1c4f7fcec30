"""The routing table: the registry's snapshot as the gateway sees it, kept fresh.

``RoutingTable(loader, feed=..., on_snapshot=...)`` loads the snapshot (``loader`` is a blocking
callable, run in a thread), reloads on every change-feed notification (and every
``refresh_s`` as a safety net), and hands each new snapshot to ``on_snapshot`` (the router's
``update_snapshot``). When the registry database is unreachable it keeps serving the last
snapshot, marks itself ``stale`` (shown in /readyz) and logs once per transition.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import logging
import time
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Protocol

from registry.snapshot import RoutingSnapshot

log = logging.getLogger("loraplane.gateway.table")


class Feed(Protocol):
    def listen(self) -> AsyncIterator[int]: ...


class RoutingTable:
    def __init__(
        self,
        loader: Callable[[], RoutingSnapshot],
        *,
        feed: Feed | None = None,
        on_snapshot: Callable[[RoutingSnapshot], Any] | None = None,
        refresh_s: float = 15.0,
        retry_s: float = 1.0,
    ) -> None:
        self._loader = loader
        self._feed = feed
        self._on_snapshot = on_snapshot
        self._refresh_s = refresh_s
        self._retry_s = min(retry_s, refresh_s)
        self.snapshot: RoutingSnapshot | None = None
        self.stale = False  # True while the last reload attempt failed
        self.last_error: str | None = None
        self.loaded_at: float | None = None  # time.time() of the last successful load
        self.reloads = 0
        self.changed_at: float | None = None  # time.time() when a new revision was installed
        self.notified_at: float | None = None  # time.time() of the last change-feed notification
        self.load_ms: float | None = None  # how long the last snapshot load took
        self._wanted = asyncio.Event()
        self._seen_revision = -1
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
        self._tasks.append(asyncio.create_task(self._reload_loop(), name="table-reload"))
        if self._feed is not None:
            self._tasks.append(asyncio.create_task(self._feed_loop(), name="table-feed"))

    async def stop(self) -> None:
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        self._tasks.clear()
        self._executor.shutdown(wait=False, cancel_futures=True)

    def notify(self, revision: int | None = None) -> None:
        """Ask for a reload (a change-feed notification)."""
        self.notified_at = time.time()
        if revision is not None:
            self._seen_revision = max(self._seen_revision, revision)
            if self.snapshot is not None and revision <= self.snapshot.revision and not self.stale:
                return
        self._wanted.set()

    async def reload(self) -> bool:
        """Load the snapshot now; True on success. Never raises (logs transitions)."""
        t0 = time.perf_counter()
        try:
            loop = asyncio.get_running_loop()
            snap = await loop.run_in_executor(self._executor, functools.partial(self._loader))
        except Exception as e:  # any registry failure keeps the last snapshot
            self.last_error = f"{type(e).__name__}: {e}"[:500]
            if not self.stale:
                self.stale = True
                log.warning(
                    "registry unreachable; serving the last routing snapshot",
                    extra={"error": self.last_error, "revision": self.revision},
                )
            return False
        if self.stale:
            log.warning("registry reachable again", extra={"revision": snap.revision})
        self.stale = False
        self.last_error = None
        self.loaded_at = time.time()
        self.load_ms = round((time.perf_counter() - t0) * 1000, 2)
        changed = self.snapshot is None or snap.revision != self.snapshot.revision
        self.snapshot = snap
        self.reloads += 1
        if changed:
            self.changed_at = time.time()
        if changed and self._on_snapshot is not None:
            try:
                res = self._on_snapshot(snap)
                if inspect.isawaitable(res):
                    await res
            except Exception:  # the router's problem must not stop the table
                log.exception("router.update_snapshot failed", extra={"revision": snap.revision})
        if changed:
            async with self._changed:
                self._changed.notify_all()
        return True

    async def wait_for_revision(self, revision: int, timeout: float) -> bool:
        """Wait until the table holds ``revision`` or later (tests and benchmarks)."""
        async with asyncio.timeout(timeout), self._changed:
            await self._changed.wait_for(lambda: (self.revision or -1) >= revision)
        return True

    async def _reload_loop(self) -> None:
        while True:
            wait = self._retry_s if self.stale or self.snapshot is None else self._refresh_s
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(wait):
                    await self._wanted.wait()
            self._wanted.clear()
            await self.reload()

    async def _feed_loop(self) -> None:
        assert self._feed is not None
        failing = False
        while True:
            try:
                async for rev in self._feed.listen():
                    if failing:
                        failing = False
                        log.warning("change feed listening again")
                        self.notify()
                    self.notify(int(rev))
            except asyncio.CancelledError:
                raise
            except Exception as e:  # reconnect forever, log once per transition
                if not failing:
                    failing = True
                    log.warning("change feed failed; retrying", extra={"error": f"{type(e).__name__}: {e}"})
            await asyncio.sleep(self._retry_s)

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
        }
