"""Redis client factory: redis.asyncio with a capped *blocking* pool (a plain capped pool raises).

A command that fails on a broken connection (Redis restarted: every pooled connection is stale,
"Connection closed by server") is sent once more on a fresh connection, as redis-py does for a
client without an explicit pool; a pool built by hand has no retry at all. Timeouts are not
retried (a hung Redis must not double the wait). Every command's answer is bounded by the socket
timeout and every new connection by the connect timeout (settings ``redis_socket_timeout_s`` and
``redis_connect_timeout_s``): a hung Redis (SIGSTOP'd, partitioned) fails calls instead of
holding them forever.
"""

from __future__ import annotations

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff
from redis.exceptions import ConnectionError as RedisConnectionError

from kit.settings import LoraplaneSettings

DEFAULT_SOCKET_TIMEOUT_S = 2.0  # = LoraplaneSettings.redis_socket_timeout_s
DEFAULT_CONNECT_TIMEOUT_S = 1.0  # = LoraplaneSettings.redis_connect_timeout_s


def reconnect_retry() -> Retry:
    """One more try on a fresh connection after a connection error (not after a timeout)."""
    return Retry(ExponentialBackoff(cap=0.25, base=0.05), 1, supported_errors=(RedisConnectionError,))


def make_redis(
    url: str,
    max_connections: int = 64,
    timeout: float = 5.0,
    *,
    socket_timeout: float = DEFAULT_SOCKET_TIMEOUT_S,
    connect_timeout: float = DEFAULT_CONNECT_TIMEOUT_S,
) -> aioredis.Redis:
    """``timeout``: the longest wait for a pooled connection; ``socket_timeout``: for one
    command's answer; ``connect_timeout``: for a new connection (``redis_socket_timeout_s`` and
    ``redis_connect_timeout_s`` of the settings: :func:`redis_from_settings`)."""
    pool = aioredis.BlockingConnectionPool.from_url(
        url,
        max_connections=max_connections,
        timeout=timeout,
        socket_timeout=socket_timeout,
        socket_connect_timeout=connect_timeout,
        retry=reconnect_retry(),
    )
    return aioredis.Redis(connection_pool=pool)


def redis_from_settings(
    settings: LoraplaneSettings, max_connections: int = 64, timeout: float = 5.0
) -> aioredis.Redis:
    """``make_redis`` for ``settings.redis_url`` with the settings' socket and connect timeouts."""
    if not settings.redis_url:
        raise ValueError("redis_url is not set")
    return make_redis(
        settings.redis_url,
        max_connections,
        timeout,
        socket_timeout=settings.redis_socket_timeout_s,
        connect_timeout=settings.redis_connect_timeout_s,
    )
