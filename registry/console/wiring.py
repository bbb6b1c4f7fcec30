"""Which traffic source a process gives its console, and the gateway side of the Redis one.

- ``loraplane up`` and ``loraplane serve --role all`` without Redis: :func:`local_traffic` (the
  gateway runs in the same process; its registries are sampled directly).
- ``loraplane serve`` with Redis: every gateway process runs :func:`publish_traffic`, and the
  admin API reads the readings with :func:`redis_traffic`.
"""

from __future__ import annotations

import redis
from fastapi import FastAPI
from prometheus_client import REGISTRY, CollectorRegistry

from registry.console.settings import ConsoleSettings
from registry.console.traffic_redis import RedisTraffic, TrafficPublisher
from registry.console.traffic_ring import RingTraffic
from registry.console.web import ConsoleState


def _registries(gateway_registry: CollectorRegistry) -> list[CollectorRegistry]:
    """The gateway's own registry and the global one (where the router counts loads)."""
    return [gateway_registry] if gateway_registry is REGISTRY else [gateway_registry, REGISTRY]


def _console(app: FastAPI) -> ConsoleState:
    cs: ConsoleState = app.state.console
    return cs


def _capacity(interval_s: float) -> int:
    return max(2, int(3600 / interval_s))


def local_traffic(app: FastAPI, gateway_registry: CollectorRegistry) -> RingTraffic:
    interval = ConsoleSettings().console_traffic_interval_s
    ring = RingTraffic(_registries(gateway_registry), interval_s=interval, capacity=_capacity(interval))
    _console(app).traffic = ring.start()
    return ring


def publish_traffic(redis_url: str, prefix: str, gateway_registry: CollectorRegistry) -> TrafficPublisher:
    interval = ConsoleSettings().console_traffic_interval_s
    client = redis.Redis.from_url(redis_url, socket_timeout=5)
    return TrafficPublisher(client, prefix, _registries(gateway_registry), interval_s=interval).start()


def redis_traffic(app: FastAPI, redis_url: str, prefix: str) -> RedisTraffic:
    interval = ConsoleSettings().console_traffic_interval_s
    client = redis.Redis.from_url(redis_url, socket_timeout=5)
    source = RedisTraffic(client, prefix, interval_s=interval, capacity=_capacity(interval))
    _console(app).traffic = source.start()
    return source
