"""Assemble a gateway from settings: snapshot loader, change feed, router, limiter.

Used by ``loraplane up`` (SQLite, in-process feed, in-memory limiter) and ``loraplane serve``
(PostgreSQL + LISTEN/NOTIFY feed, Redis limiter, S3 artifacts).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sqlalchemy import Engine

from gateway.canary import CanaryRecorder, MemoryCanaryCounters, RedisCanaryRecorder
from gateway.metrics import GatewayMetrics
from gateway.ratelimit import Limiter, MemoryLimiter, RedisLimiter
from gateway.service import Gateway
from gateway.settings import GatewaySettings
from gateway.table import AsyncLoader, ChangeApplier, Feed, RoutingTable
from registry.snapshot import RoutingSnapshot
from router.contract import RouterAPI


def snapshot_loader(engine: Engine) -> Callable[[], RoutingSnapshot]:
    """A blocking callable that reads the whole routing snapshot (PostgreSQL: one statement)."""
    from gateway.snapshot_source import make_snapshot_loader

    return make_snapshot_loader(engine)


def async_snapshot_loader(engine: Engine) -> AsyncLoader | None:
    """Whole loads on the event loop, built in slices (PostgreSQL); None: ``loader`` on a thread."""
    from gateway.snapshot_source import make_async_snapshot_loader

    return make_async_snapshot_loader(engine)


def snapshot_applier(engine: Engine) -> ChangeApplier:
    """Applies changed subjects to a snapshot (PostgreSQL: one statement on the event loop)."""
    from gateway.snapshot_source import make_change_applier

    return make_change_applier(engine)


def make_limiter(settings: GatewaySettings, redis: Any | None = None) -> Limiter:
    """Redis limiter when Redis is configured (atomic across processes), else in memory."""
    if redis is None and settings.redis_url:
        from kit.redis_factory import redis_from_settings

        redis = redis_from_settings(settings, timeout=settings.redis_timeout_s)
    if redis is None:
        return MemoryLimiter()
    return RedisLimiter(
        redis,
        prefix=settings.redis_prefix,
        lease_s=settings.lease_s,
        timeout_s=settings.redis_timeout_s,
    )


def build_gateway(
    settings: GatewaySettings,
    *,
    router: RouterAPI,
    engine: Engine | None = None,
    loader: Callable[[], RoutingSnapshot] | None = None,
    feed: Feed | None = None,
    limiter: Limiter | None = None,
    manage_router: bool = True,
) -> Gateway:
    """A gateway whose routing table follows ``feed`` and pushes every snapshot to ``router``."""
    load_async = None
    if loader is None:
        if engine is None:
            raise ValueError("build_gateway needs an engine or a loader")
        loader, load_async = snapshot_loader(engine), async_snapshot_loader(engine)
    table = RoutingTable(
        loader,
        load_async=load_async,
        feed=feed,
        apply_changes=snapshot_applier(engine) if engine is not None else None,
        on_snapshot=router.update_snapshot,
        refresh_s=settings.snapshot_refresh_s,
        verify_s=settings.snapshot_verify_s,
        freeze_gc=True,  # once, after the first load: see RoutingTable._freeze
        revision_timeout_s=settings.database_timeout_s,  # as long as any database operation
    )
    return Gateway(
        settings,
        router=router,
        table=table,
        metrics=GatewayMetrics(tenant_labels=settings.metrics_tenant_labels, snapshot_age=table.age_s),
        limiter=limiter if limiter is not None else make_limiter(settings),
        manage_router=manage_router,
        canary=make_canary_recorder(settings),
    )


def make_canary_recorder(settings: GatewaySettings) -> CanaryRecorder:
    """Canary-analysis counters (SPEC §16): batched into Redis when configured (every gateway's
    traffic counts), else in this process."""
    if not settings.redis_url:
        return MemoryCanaryCounters()
    from kit.redis_factory import redis_from_settings

    redis = redis_from_settings(settings, max_connections=4, timeout=settings.redis_timeout_s)
    return RedisCanaryRecorder(redis, settings.redis_prefix, owns_redis=True)
