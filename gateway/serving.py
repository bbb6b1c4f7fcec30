"""Run ASGI apps under uvicorn (uvloop + httptools) — several servers on one event loop,
with our own SIGINT/SIGTERM handling (uvicorn's would re-raise the signal after shutdown)."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import signal
from collections.abc import Awaitable, Callable, Generator
from typing import Any, Literal

import uvicorn

from gateway.coalesce import CoalescingHttpToolsProtocol

GC_YOUNG_THRESHOLD = 10_000


def settle_heap() -> None:
    """Once a serving process has started: collect, then freeze what is left (gc.freeze) and raise
    the young generation's threshold to ``GC_YOUNG_THRESHOLD`` allocations.

    The ~150k objects of a started gateway (modules, settings, routing snapshot, clients) are
    long-lived, yet every full collection walked them all: ~80 ms pauses, ~5% of the CPU at full
    load; and with the default threshold of 700 the young generation was collected every few
    requests although per-request objects are freed by reference counting (the cyclic collector
    finds next to nothing). Frozen objects are still freed when their references go; only cycles
    among them would no longer be collected.
    """
    gc.collect()
    gc.freeze()
    young, *older = gc.get_threshold()
    gc.set_threshold(max(young, GC_YOUNG_THRESHOLD), *older)


class QuietServer(uvicorn.Server):
    """A uvicorn server that leaves signal handling to its owner."""

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield


def make_server(
    app: Any,
    host: str,
    port: int,
    *,
    log_level: str = "warning",
    lifespan: Literal["auto", "on", "off"] = "on",
) -> QuietServer:
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        loop="uvloop",
        http=CoalescingHttpToolsProtocol,  # httptools, one socket write per answer
        lifespan=lifespan,
        log_level=log_level.lower(),
        log_config=None,  # uvicorn's records go to the process's own handler (kit.logs): one format
        access_log=False,
        # nothing reads the client address (no X-Forwarded-For rewriting: one middleware call less)
        proxy_headers=False,
        server_header=False,
        date_header=False,
        timeout_graceful_shutdown=5,
        backlog=4096,
    )
    return QuietServer(config)


async def serve_all(
    servers: list[QuietServer],
    stop: asyncio.Event | None = None,
    *,
    drain: Callable[[], Awaitable[object]] | None = None,
) -> None:
    """Serve until SIGINT/SIGTERM (or ``stop``), then ``drain`` (still serving: the gateway fails
    /readyz, refuses new requests and lets those in flight finish), then shut every server down."""
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
    tasks = [asyncio.create_task(s.serve()) for s in servers]
    waiter = asyncio.create_task(stop.wait())
    done, _ = await asyncio.wait([*tasks, waiter], return_when=asyncio.FIRST_COMPLETED)
    if drain is not None and waiter in done:
        await drain()
    for s in servers:
        s.should_exit = True
    await asyncio.gather(*tasks, return_exceptions=True)
    waiter.cancel()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.remove_signal_handler(sig)
    for t in tasks:
        if t in done and t.exception() is not None:
            raise t.exception()  # type: ignore[misc]


async def wait_started(servers: list[QuietServer], timeout: float = 30.0) -> None:
    async with asyncio.timeout(timeout):
        while not all(s.started for s in servers):
            for s in servers:
                if s.should_exit:
                    raise RuntimeError("a server failed to start")
            await asyncio.sleep(0.02)
