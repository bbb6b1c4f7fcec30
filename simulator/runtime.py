"""Drives the pure ``EngineModel`` in real time on the asyncio loop.

One timer per app: after every change the driver advances the engine to ``time.monotonic()``,
hands each event to the subscriber of its request, and re-arms the timer for the engine's
next event. Several submits in one loop iteration are batched into one advance.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from simulator.engine import EngineEvent, EngineModel

EventCallback = Callable[[EngineEvent], None]


class EngineDriver:
    def __init__(self, engine: EngineModel, on_record: Callable[[], None] | None = None) -> None:
        self.engine = engine
        self._subs: dict[str, EventCallback] = {}
        self._timer: asyncio.TimerHandle | None = None
        self._kick_pending = False
        self._on_record = on_record

    @staticmethod
    def now() -> float:
        return time.monotonic()

    def submit(
        self,
        req_id: str,
        lora: str | None,
        prompt_tokens: int,
        max_tokens: int,
        callback: EventCallback,
        *,
        want_tokens: bool = False,
    ) -> None:
        self._subs[req_id] = callback
        self.engine.add_request(
            req_id, lora, prompt_tokens, max_tokens, time.monotonic(), want_tokens=want_tokens
        )
        self.kick()

    def abort(self, req_id: str) -> None:
        if self._subs.pop(req_id, None) is not None:
            self.engine.abort_request(req_id, time.monotonic())
            self.kick()

    def kick(self) -> None:
        if not self._kick_pending:
            self._kick_pending = True
            asyncio.get_running_loop().call_soon(self._run)

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _run(self) -> None:
        self._kick_pending = False
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        now = time.monotonic()
        events = self.engine.advance(now)
        subs = self._subs
        for ev in events:
            cb = subs.get(ev.req_id)
            if cb is not None:
                if ev.kind == "finished":
                    del subs[ev.req_id]
                cb(ev)
        if events and self._on_record is not None:
            self._on_record()
        nxt = self.engine.next_event_time()
        if nxt is not None:
            loop = asyncio.get_running_loop()
            self._timer = loop.call_later(max(0.0, nxt - time.monotonic()), self._run)
