"""The gateway's moving parts in one object: routing table, router, limiter, auth, metrics.

``Gateway`` is what the ASGI app (``gateway.api``) serves; it owns the start/stop order
(router first so the first snapshot reaches it, then the table) and the per-adapter cap on
requests waiting for a cold load.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import random
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from typing import Any, Protocol

from gateway.auth import Authenticator
from gateway.errors import GatewayError
from gateway.metrics import GatewayMetrics
from gateway.ratelimit import Limiter, MemoryLimiter
from gateway.settings import GatewaySettings
from gateway.table import RoutingTable
from registry.snapshot import VersionInfo
from router.contract import ForwardRequest, ForwardResult

log = logging.getLogger("loraplane.gateway")

_NOTHING: AbstractContextManager[None] = contextlib.nullcontext()


class RouterLike(Protocol):
    """What the gateway needs of ``router.Router`` (router/contract.py)."""

    async def forward(self, req: ForwardRequest) -> ForwardResult: ...

    def ready(self) -> bool: ...


class ColdLoadGate:
    """Caps, per adapter, the requests waiting for a version that is not resident.

    Residency comes from the router's ``is_resident(lora_name)`` when it has one; otherwise a
    version counts as cold until this process has seen an answer for it that needed no load.
    """

    def __init__(self, cap: int, is_resident: Callable[[str], bool] | None = None) -> None:
        self.cap = cap
        self._is_resident = is_resident
        self._warm: set[str] = set()
        self.waiting: dict[str, int] = {}

    def _cold(self, version: VersionInfo) -> bool:
        name = version.lora_name
        if self._is_resident is not None:
            try:
                return not self._is_resident(name)
            except Exception:  # a broken residency check: fall back to what this process saw
                pass
        return name not in self._warm

    def seen(self, version: VersionInfo) -> None:
        """An answer came for ``version``: it is resident somewhere now."""
        if len(self._warm) > 100_000:
            self._warm.clear()
        self._warm.add(version.lora_name)

    def enter(self, version: VersionInfo | None) -> AbstractContextManager[None]:
        """Context of one request for ``version``: counted while the version is cold."""
        if version is None or not self._cold(version):
            return _NOTHING
        return self._waiting(version)

    @contextlib.contextmanager
    def _waiting(self, version: VersionInfo) -> Iterator[None]:
        aid = version.adapter_id
        n = self.waiting.get(aid, 0)
        if n >= self.cap:
            raise GatewayError(
                503,
                "no_capacity",
                f"Too many requests are waiting for the adapter `{aid}` to load; retry shortly.",
                retry_after=2,
            )
        self.waiting[aid] = n + 1
        try:
            yield
        finally:
            left = self.waiting[aid] - 1
            if left:
                self.waiting[aid] = left
            else:
                del self.waiting[aid]


class Gateway:
    def __init__(
        self,
        settings: GatewaySettings,
        *,
        router: Any,
        table: RoutingTable,
        limiter: Limiter | None = None,
        metrics: GatewayMetrics | None = None,
        manage_router: bool = True,
        rand: Callable[[], float] = random.random,
    ) -> None:
        self.settings = settings
        self.router = router
        self.table = table
        self.limiter: Limiter = limiter if limiter is not None else MemoryLimiter()
        self.metrics = metrics or GatewayMetrics(tenant_labels=settings.metrics_tenant_labels)
        token = settings.admin_token.get_secret_value() if settings.admin_token else None
        self.auth = Authenticator(admin_token=token, cache_size=settings.key_cache_size)
        self.cold = ColdLoadGate(settings.cold_load_queue_cap, getattr(router, "is_resident", None))
        self.manage_router = manage_router
        self.rand = rand
        self.limiter_down = False  # last rate-limit store call failed
        self._started = False

    async def start(self) -> None:
        if self._started:
            return
        self._started = True
        if self.manage_router and hasattr(self.router, "start"):
            await _maybe_await(self.router.start())
        await self.table.start()

    async def stop(self) -> None:
        if not self._started:
            return
        self._started = False
        await self.table.stop()
        if self.manage_router and hasattr(self.router, "stop"):
            await _maybe_await(self.router.stop())
        with contextlib.suppress(Exception):
            await self.limiter.close()

    def router_ready(self) -> bool:
        try:
            return bool(self.router.ready())
        except Exception:  # a broken router is not ready
            return False

    def healthy_replicas(self) -> int | None:
        fn = getattr(self.router, "healthy_count", None)
        if fn is None:
            return None
        try:
            return int(fn())
        except Exception:
            return None

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


async def _maybe_await(value: Any) -> Any:
    if inspect.isawaitable(value):
        return await value
    return value
