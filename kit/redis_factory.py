"""Redis client factory: redis.asyncio with a capped *blocking* pool (a plain capped pool raises).

A command that fails on a broken connection (Redis restarted: every pooled connection is stale,
"Connection closed by server") is sent once more on a fresh connection, as redis-py does for a
client without an explicit pool; a pool built by hand has no retry at all. Timeouts are not
retried (a hung Redis must not double the wait).
"""

from __future__ import annotations

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff
from redis.exceptions import ConnectionError as RedisConnectionError


def reconnect_retry() -> Retry:
    """One more try on a fresh connection after a connection error (not after a timeout)."""
    return Retry(ExponentialBackoff(cap=0.25, base=0.05), 1, supported_errors=(RedisConnectionError,))


def make_redis(url: str, max_connections: int = 64, timeout: float = 5.0) -> aioredis.Redis:
    pool = aioredis.BlockingConnectionPool.from_url(
        url,
        max_connections=max_connections,
        timeout=timeout,
        socket_connect_timeout=2.0,
        retry=reconnect_retry(),
    )
    return aioredis.Redis(connection_pool=pool)
