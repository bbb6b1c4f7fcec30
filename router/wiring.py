"""How a ``Router`` gets its connections: the cluster state and demand board (shared through
Redis when the process has one, else in the process), and one engine driver per pool over one
HTTP session (``router.core`` wires the rest)."""

from __future__ import annotations

from typing import TypeVar

import aiohttp
import redis.asyncio as aioredis

from router.cluster import Board, ClusterState, MemoryBoard, MemoryCluster, RedisBoard, RedisCluster
from router.drivers import EngineDriver, make_driver
from router.settings import RouterSettings

T = TypeVar("T")


def started(part: T | None) -> T:
    """``part`` once ``Router.start()`` has made it."""
    if part is None:
        raise RuntimeError("Router.start() was not called")
    return part


def cluster_and_board(
    settings: RouterSettings, redis: aioredis.Redis | None, cluster: ClusterState | None
) -> tuple[ClusterState, Board]:
    """The cluster state (``cluster`` if given) and the demand board beside it."""
    if cluster is None:
        cluster = (
            RedisCluster(
                redis, settings.redis_prefix, lease_s=settings.lease_s, linger_s=settings.mark_linger_s
            )
            if redis is not None
            else MemoryCluster()
        )
    shared = redis is not None and isinstance(cluster, RedisCluster)
    board: Board = RedisBoard(redis, settings.redis_prefix) if shared and redis is not None else MemoryBoard()
    return cluster, board


def open_drivers(settings: RouterSettings) -> tuple[aiohttp.ClientSession, dict[str, EngineDriver]]:
    """One HTTP session (connections per replica capped) and each pool's engine driver on it."""
    s = settings
    connector = aiohttp.TCPConnector(
        limit=0, limit_per_host=s.max_connections_per_replica, keepalive_timeout=30, ttl_dns_cache=60
    )
    session = aiohttp.ClientSession(connector=connector, auto_decompress=False)
    timeout = aiohttp.ClientTimeout(total=s.request_timeout_s, connect=s.connect_timeout_s)
    stream_timeout = aiohttp.ClientTimeout(
        total=None, connect=s.connect_timeout_s, sock_read=s.upstream_idle_timeout_s
    )
    staging_dir = s.resolved_staging_dir()
    drivers = {
        p.name: make_driver(
            p, session, staging_dir=staging_dir, timeout=timeout, stream_timeout=stream_timeout
        )
        for p in s.pools
    }
    return session, drivers
