"""Redis client factory: redis.asyncio with a capped *blocking* pool (a plain capped pool raises)."""

from __future__ import annotations

import redis.asyncio as aioredis


def make_redis(url: str, max_connections: int = 64, timeout: float = 5.0) -> aioredis.Redis:
    pool = aioredis.BlockingConnectionPool.from_url(
        url, max_connections=max_connections, timeout=timeout, socket_connect_timeout=2.0
    )
    return aioredis.Redis(connection_pool=pool)
