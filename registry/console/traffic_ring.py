"""``TrafficRing``: the last hour of intervals with running totals; ``RingTraffic``: the embedded
default that fills one from this process's Prometheus registries on a daemon thread."""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable

from prometheus_client import CollectorRegistry

from registry.console.traffic import (
    Counters,
    Interval,
    Key,
    Sample,
    TrafficWindow,
    add_counters,
    copy_counters,
    deltas_between,
    quantile,
    read_registries,
)

log = logging.getLogger("loraplane.registry.console")


class TrafficRing:
    """Bounded ring of intervals (``capacity``) with the window's totals kept as a running sum:
    added when an interval enters, subtracted when it leaves."""

    def __init__(self, capacity: int = 360) -> None:
        self._capacity = capacity
        self._ring: deque[tuple[Interval, dict[Key, Counters]]] = deque()
        self._totals: dict[Key, Counters] = {}
        self._start: float | None = None
        self._end = 0.0
        self._lock = threading.Lock()

    def add_interval(self, ts: float, deltas: dict[Key, Counters]) -> None:
        """Close the interval ending at ``ts`` (the first call only marks the window's start)."""
        with self._lock:
            if self._start is None:
                self._start = self._end = ts
                return
            self._end = ts
            interval = Interval(
                ts=ts, series={k: (d.requests, quantile(0.5, d.ttft)) for k, d in deltas.items()}
            )
            self._ring.append((interval, deltas))
            for key, d in deltas.items():
                add_counters(self._totals.setdefault(key, Counters()), d, 1.0)
            while len(self._ring) > self._capacity:
                old, old_deltas = self._ring.popleft()
                self._start = old.ts
                for key, d in old_deltas.items():
                    total = self._totals[key]
                    add_counters(total, d, -1.0)
                    if (
                        max(total.requests, total.errors, total.rate_limited, total.loads, total.cold_waits)
                        <= 0
                    ):
                        del self._totals[key]

    def window(self) -> TrafficWindow:
        with self._lock:
            start = self._start if self._start is not None else 0.0
            return TrafficWindow(
                start=start,
                end=self._end if self._start is not None else 0.0,
                totals={k: copy_counters(c) for k, c in self._totals.items()},
                intervals=[i for i, _ in self._ring],
            )


class Poller:
    """Calls ``tick`` every ``interval_s`` on a daemon thread until ``close``; a failing tick is
    logged and retried at the next one."""

    def __init__(self, tick: Callable[[], None], interval_s: float, name: str) -> None:
        self._tick = tick
        self.interval_s = interval_s
        self._name = name
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self._thread is None:
            self._safe_tick()
            self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
            self._thread.start()

    def _safe_tick(self) -> None:
        try:
            self._tick()
        except Exception as e:  # a background sampler never dies of one bad reading
            log.warning("console traffic sampling failed", extra={"error": f"{type(e).__name__}: {e}"})

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._safe_tick()

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None


class RingTraffic:
    """The embedded default: this process's registries sampled every ``interval_s``."""

    description = "sampled in this process from the embedded gateway's metrics"

    def __init__(
        self,
        registries: list[CollectorRegistry],
        *,
        interval_s: float = 10.0,
        capacity: int = 360,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._registries = list(registries)
        self._clock = clock
        self._ring = TrafficRing(capacity)
        self._last: dict[Key, Counters] = {}
        self._poller = Poller(self.sample, interval_s, "console-traffic")

    def sample(self) -> None:
        """Read the registries now (the thread calls this every ``interval_s``)."""
        self.add(Sample(self._clock(), read_registries(self._registries)))

    def add(self, sample: Sample) -> None:
        """Take one cumulative reading: it closes the interval since the previous one."""
        prev, self._last = self._last, sample.series
        self._ring.add_interval(sample.ts, deltas_between(sample.series, prev))

    def window(self) -> TrafficWindow:
        return self._ring.window()

    def start(self) -> RingTraffic:
        self._poller.start()
        return self

    def close(self) -> None:
        self._poller.close()
