"""The gateway's moving parts in one object: routing table, router, limiter, auth, metrics.

``Gateway`` is what the ASGI app (``gateway.api``) serves; it owns the start/stop order
(router first so the first snapshot reaches it, then the table) and the per-adapter and
per-tenant caps on requests waiting for a cold load.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager

from gateway.auth import Authenticator
from gateway.canary import CanaryRecorder, MemoryCanaryCounters
from gateway.errors import GatewayError
from gateway.metrics import GatewayMetrics
from gateway.metrics_sweep import SeriesSweeper, sweeper_for
from gateway.ratelimit import Limiter, MemoryLimiter
from gateway.settings import GatewaySettings
from gateway.table import RoutingTable
from registry.snapshot import TenantInfo, VersionInfo
from router.contract import RouterAPI

log = logging.getLogger("loraplane.gateway")

_WARM: AbstractContextManager[bool] = contextlib.nullcontext(False)


class ColdLoadGate:
    """Caps the requests waiting for a version that is not resident (SPEC §15): per adapter
    (``cap``, ``LORAPLANE_COLD_LOAD_QUEUE_CAP``) and per tenant (the tenant's
    ``max_cold_waiters``; None = unlimited). Beyond either cap: 503 ``no_capacity`` with
    Retry-After at once, ``details`` naming the level and the limit.

    Counted in this gateway process: with N gateways a tenant may have up to N times its
    ``max_cold_waiters`` waiting cluster-wide. A version is cold while no healthy replica holds it
    (the router's ``is_resident``, which follows loads, evictions and unloads of every gateway
    process); a request is counted from the moment it finds its version cold until the router
    answers (first byte), fails, or the request is cancelled.
    """

    RETRY_AFTER_S = 2

    def __init__(self, cap: int, is_resident: Callable[[str], bool]) -> None:
        self.cap = cap
        self._is_resident = is_resident
        self.waiting: dict[str, int] = {}  # adapter id → requests waiting for its load
        self.tenant_waiting: dict[str, int] = {}  # tenant id → its requests waiting for a load

    def _cold(self, version: VersionInfo) -> bool:
        return not self._is_resident(version.lora_name)

    def enter(
        self, version: VersionInfo | None, tenant: TenantInfo | None = None
    ) -> AbstractContextManager[bool]:
        """Context of one request of ``tenant`` for ``version``: counted while the version is cold.
        Its value says whether the request is counted (the version was cold)."""
        if version is None or not self._cold(version):
            return _WARM
        return self._waiting(version, tenant)

    def _full(self, level: str, limit: str, value: int, message: str) -> GatewayError:
        details: dict[str, object] = {
            "level": level,
            "limit": limit,
            "value": value,
            "retry_after_s": self.RETRY_AFTER_S,
        }
        return GatewayError(503, "no_capacity", message, retry_after=self.RETRY_AFTER_S, details=details)

    @contextlib.contextmanager
    def _waiting(self, version: VersionInfo, tenant: TenantInfo | None) -> Iterator[bool]:
        aid = version.adapter_id
        if self.waiting.get(aid, 0) >= self.cap:
            raise self._full(
                "adapter", "cold_load_queue_cap", self.cap,
                f"Too many requests are waiting for the adapter `{aid}` to load; retry shortly.",
            )  # fmt: skip
        # every tenant's waiters are counted, capped or not, so a cap set later sees them at once
        tid = tenant.id if tenant is not None else None
        cap = tenant.max_cold_waiters if tenant is not None else None
        if tid is not None and cap is not None and self.tenant_waiting.get(tid, 0) >= cap:
            raise self._full(
                "tenant", "max_cold_waiters", cap,
                f"Too many of this tenant's requests are waiting for adapters to load "
                f"(max_cold_waiters {cap}); retry shortly.",
            )  # fmt: skip
        _add(self.waiting, aid, 1)
        if tid is not None:
            _add(self.tenant_waiting, tid, 1)
        try:
            yield True
        finally:
            _add(self.waiting, aid, -1)
            if tid is not None:
                _add(self.tenant_waiting, tid, -1)


def _add(counts: dict[str, int], key: str, n: int) -> None:
    """``counts[key] += n``; a key whose count reaches 0 is removed."""
    left = counts.get(key, 0) + n
    if left > 0:
        counts[key] = left
    else:
        counts.pop(key, None)


class Gateway:
    def __init__(
        self,
        settings: GatewaySettings,
        *,
        router: RouterAPI,
        table: RoutingTable,
        limiter: Limiter | None = None,
        metrics: GatewayMetrics | None = None,
        manage_router: bool = True,
        rand: Callable[[], float] = random.random,
        canary: CanaryRecorder | None = None,
    ) -> None:
        self.settings = settings
        self.router = router
        self.table = table
        self.limiter: Limiter = limiter if limiter is not None else MemoryLimiter()
        self.metrics = metrics or GatewayMetrics(tenant_labels=settings.metrics_tenant_labels)
        token = settings.admin_token.get_secret_value() if settings.admin_token else None
        self.auth = Authenticator(admin_token=token, cache_size=settings.key_cache_size)
        self.cold = ColdLoadGate(settings.cold_load_queue_cap, router.is_resident)
        # canary analysis counters (SPEC §16): in memory, or batched to Redis (gateway.build)
        self.canary: CanaryRecorder = canary if canary is not None else MemoryCanaryCounters()
        self.manage_router = manage_router
        self.rand = rand
        self.limiter_down = False  # last rate-limit store call failed
        self.draining = False  # shutting down: /readyz fails so load balancers stop sending
        self.active = 0  # completion requests in flight (streams included)
        self._started = False
        self.metrics_sweeper: SeriesSweeper | None = None  # bounds /metrics (gateway.metrics_sweep)

    async def start(self) -> None:
        if self._started:
            return
        self._started = True
        if self.manage_router:
            await self.router.start()
        await self.table.start()
        self.metrics_sweeper = sweeper_for(
            self.metrics, self.router, lambda: self.table.snapshot, self.settings.metrics_series_ttl_s
        )
        self.metrics_sweeper.start()

    async def stop(self) -> None:
        if not self._started:
            return
        self._started = False
        self.draining = True
        if self.metrics_sweeper is not None:
            await self.metrics_sweeper.stop()
        await self.table.stop()
        if self.manage_router:
            await self.router.stop()
        with contextlib.suppress(Exception):
            await self.limiter.close()
        with contextlib.suppress(Exception):
            await self.canary.close()

    async def drain(self, timeout_s: float) -> int:
        """SIGTERM (SPEC §18): fail /readyz and refuse new requests at once, then wait up to
        ``timeout_s`` for the requests in flight to finish. Returns how many were still going."""
        self.draining = True
        log.warning("draining", extra={"in_flight": self.active, "timeout_s": timeout_s})
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while self.active > 0 and loop.time() < deadline:
            await asyncio.sleep(0.05)
        if self.active:
            log.warning("drain time over; requests still in flight are cut", extra={"in_flight": self.active})
        return self.active

    def healthy_replicas(self) -> int:
        return self.router.healthy_count()

    def limiter_failed(self, failed: bool) -> None:
        """Log once per transition of the rate-limit store's health."""
        if failed and not self.limiter_down:
            log.error(
                "rate-limit store unreachable; applying ratelimit_on_error",
                extra={"mode": self.settings.ratelimit_on_error},
            )
        elif not failed and self.limiter_down:
            log.warning("rate-limit store reachable again")
        self.limiter_down = failed
