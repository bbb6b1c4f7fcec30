"""Traffic across processes: gateways publish their readings to Redis, the admin API reads them.

Protocol (one Redis hash, ``{prefix}console:traffic``; field = a gateway process id, value =
JSON ``{"v": 2, "ts": unix_seconds, "series": [[adapter, version, requests, errors, tokens,
loads, cold_waits, ttft, itl, rate_limited, latency], …]}`` — the process's cumulative counters,
each histogram as ``[[le, count], …]`` with ``le`` a string such as ``"0.025"`` or ``"inf"``; a
version 1 reading (without ``rate_limited`` and ``latency``, from a gateway not yet upgraded) is
read with those at zero):

- ``TrafficPublisher`` (in every ``loraplane serve --role gateway`` process) writes its reading
  every ``interval_s`` with ``HSET`` and keeps the hash alive for an hour (``EXPIRE``); readings
  stay small (one entry per adapter version the process has served).
- ``RedisTraffic`` (the admin API's ``TrafficSource``) reads the hash every ``interval_s``,
  diffs each gateway's reading against that gateway's previous one (a restarted gateway, whose
  counters went back to zero, costs one interval), sums the gateways' differences into one
  interval and keeps the last hour in a ``TrafficRing``. Readings older than an hour are
  deleted (``HDEL``): a gateway that stopped.

Redis errors are logged and the next tick tries again; the page shows what was collected.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import time
from collections.abc import Callable
from typing import Any

import redis
from prometheus_client import CollectorRegistry

from registry.console.traffic import (
    Counters,
    Key,
    TrafficWindow,
    deltas_between,
    merge,
    read_registries,
)
from registry.console.traffic_ring import Poller, TrafficRing

log = logging.getLogger("loraplane.registry.console")

KEEP_S = 3600
VERSION = 2
READABLE = (1, 2)


def traffic_key(prefix: str) -> str:
    return f"{prefix}console:traffic"


def encode(ts: float, series: dict[Key, Counters]) -> str:
    def buckets(b: dict[float, float]) -> list[list[Any]]:
        return [[str(le), v] for le, v in sorted(b.items())]

    rows = [
        [a, v, c.requests, c.errors, c.tokens, c.loads, c.cold_waits, buckets(c.ttft), buckets(c.itl),
         c.rate_limited, buckets(c.latency)]
        for (a, v), c in series.items()
    ]  # fmt: skip
    return json.dumps({"v": VERSION, "ts": ts, "series": rows}, separators=(",", ":"))


def decode(raw: str | bytes) -> tuple[float, dict[Key, Counters]] | None:
    """A published reading, or None when it is not one this version understands."""
    try:
        doc = json.loads(raw)
        if doc.get("v") not in READABLE:
            return None
        out: dict[Key, Counters] = {}
        for row in doc["series"]:
            a, v, req, err, tok, loads, cold, ttft, itl = row[:9]
            limited, latency = row[9:11] if doc["v"] >= 2 else (0.0, [])
            out[(str(a), str(v))] = Counters(
                requests=float(req),
                errors=float(err),
                tokens=float(tok),
                loads=float(loads),
                cold_waits=float(cold),
                ttft={float(le): float(n) for le, n in ttft},
                itl={float(le): float(n) for le, n in itl},
                rate_limited=float(limited),
                latency={float(le): float(n) for le, n in latency},
            )
        return float(doc["ts"]), out
    except (ValueError, TypeError, KeyError, AttributeError):
        return None


def process_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


class TrafficPublisher:
    """Publishes this gateway process's readings (its registries) to Redis every ``interval_s``."""

    def __init__(
        self,
        client: redis.Redis,
        prefix: str,
        registries: list[CollectorRegistry],
        *,
        interval_s: float = 10.0,
        gateway_id: str | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._client = client
        self._key = traffic_key(prefix)
        self._registries = list(registries)
        self._id = gateway_id or process_id()
        self._clock = clock
        self._poller = Poller(self.publish, interval_s, "console-traffic-publish")

    def publish(self) -> None:
        value = encode(self._clock(), read_registries(self._registries))
        try:
            pipe = self._client.pipeline(transaction=False)
            pipe.hset(self._key, self._id, value)
            pipe.expire(self._key, KEEP_S)
            pipe.execute()
        except redis.RedisError as e:
            log.warning("console traffic publish failed", extra={"error": f"{type(e).__name__}: {e}"})

    def start(self) -> TrafficPublisher:
        self._poller.start()
        return self

    def close(self) -> None:
        self._poller.close()


class RedisTraffic:
    """``TrafficSource`` fed by the gateways' published readings."""

    description = "published to Redis by every gateway process, read by this admin API"

    def __init__(
        self,
        client: redis.Redis,
        prefix: str,
        *,
        interval_s: float = 10.0,
        capacity: int = 360,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._client = client
        self._key = traffic_key(prefix)
        self._clock = clock
        self._ring = TrafficRing(capacity)
        self._last: dict[str, tuple[float, dict[Key, Counters]]] = {}
        self._poller = Poller(self.read, interval_s, "console-traffic-read")

    def read(self) -> None:
        """Read every gateway's reading now and close one interval with their differences."""
        try:
            raw: dict[bytes | str, bytes | str] = self._client.hgetall(self._key)  # type: ignore[assignment]
        except redis.RedisError as e:
            log.warning("console traffic read failed", extra={"error": f"{type(e).__name__}: {e}"})
            return
        now = self._clock()
        total: dict[Key, Counters] = {}
        stale: list[bytes | str] = []
        for field, value in raw.items():
            gw = field.decode() if isinstance(field, bytes) else field
            reading = decode(value)
            if reading is None:
                continue
            ts, series = reading
            if ts < now - KEEP_S:
                stale.append(field)
                continue
            prev = self._last.get(gw)
            if prev is not None and prev[0] == ts:
                continue  # nothing new from this gateway since the last tick
            self._last[gw] = (ts, series)
            if prev is not None:  # a gateway's first reading is its baseline
                merge(total, deltas_between(series, prev[1]))
        if stale:
            with contextlib.suppress(redis.RedisError):
                self._client.hdel(self._key, *stale)
        self._ring.add_interval(now, total)

    def window(self) -> TrafficWindow:
        return self._ring.window()

    def start(self) -> RedisTraffic:
        self._poller.start()
        return self

    def close(self) -> None:
        self._poller.close()
