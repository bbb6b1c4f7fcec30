"""The router runtime (SPEC §8): replicas, residency, placement, verified loads, forwarding.

Public surface::

    from router import Router, RouterSettings
    router = Router(settings, store=artifact_store, audit=audit_sink, redis=redis_or_None)
    await router.start()
    router.update_snapshot(snapshot)          # on every registry revision
    result = await router.forward(ForwardRequest(...))   # see router.contract
    router.ready(); router.healthy_count("demo-base"); router.directory
    await router.stop()

Errors raised by ``forward`` are ``router.contract.RouterError`` subclasses.
"""

from router.contract import (
    AdapterLoadFailed,
    ForwardRequest,
    ForwardResult,
    NoCapacity,
    RouterError,
    UpstreamError,
    UpstreamTimeout,
    Usage,
)
from router.core import Router
from router.settings import PoolConfig, RouterSettings, StagingConfig

__all__ = [
    "AdapterLoadFailed",
    "ForwardRequest",
    "ForwardResult",
    "NoCapacity",
    "PoolConfig",
    "Router",
    "RouterError",
    "RouterSettings",
    "StagingConfig",
    "UpstreamError",
    "UpstreamTimeout",
    "Usage",
]
