"""Start the canary analyser in a serving process (``loraplane serve``, ``loraplane up``).

With Redis: the counters every gateway adds to, and a Redis lease (one analyser in the cluster,
whichever process holds it). Without: the gateway's in-process counters and a lease that is
always held (one process is the whole platform).
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Engine

from kit.db import make_session_factory
from registry.canary.analyser import CanaryAnalyser
from registry.canary.counters import CounterSource, RedisCounterSource
from registry.canary.lease import Lease, LocalLease, RedisLease
from registry.feed import ChangeFeed


def start_analyser(
    engine: Engine,
    *,
    promotion_ttl_s: float,
    redis: Any | None = None,
    redis_prefix: str = "loraplane:",
    local_counters: CounterSource | None = None,
    tick_s: float = 1.0,
    feed: ChangeFeed | None = None,
) -> CanaryAnalyser | None:
    """A running analyser (call from the event loop), or None when this process cannot see the
    counters (no Redis and no gateway of its own). ``feed``: the process's change feed, which
    announces the analyser's changes to the gateways."""
    counters: CounterSource
    lease: Lease
    if redis is not None:
        counters, lease = RedisCounterSource(redis, redis_prefix), RedisLease(redis, redis_prefix)
    elif local_counters is not None:
        counters, lease = local_counters, LocalLease()
    else:
        return None
    analyser = CanaryAnalyser(
        session_factory=make_session_factory(engine),
        counters=counters,
        lease=lease,
        promotion_ttl_s=promotion_ttl_s,
        tick_s=tick_s,
        feed=feed,
    )
    analyser.start()
    return analyser
