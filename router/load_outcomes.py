"""What the loader does with a load that did not simply succeed (``router.loader``).

- ``settle_unanswered``: a load call that got no answer (timeout, broken connection) may still
  finish on the replica. Its record stays ``loading`` — counted toward ``max_adapters`` (issue
  24.9) — while the replica's listing is watched for ``load_settle_s``; if the name never shows,
  it is unloaded (best effort), so a load that completes after the last look stays counted no
  longer than that.
- ``FailedLoads``: a failed load's record in every place an operator looks: the residency in
  this process (``failed`` with its reason), the load metric by result, a log line, the
  ``adapter.load_failed`` audit event, and the cluster record (with whether to retry elsewhere).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any

from registry.snapshot import VersionInfo
from router.audit import RouterAudit
from router.cluster import ClusterState
from router.drivers import DriverError
from router.metrics import RouterMetrics
from router.settings import RouterSettings
from router.store import ReplicaState

log = logging.getLogger("loraplane.router.loader")

SETTLE_POLL_S = 0.25  # how often the replica's listing is read while an unanswered load settles


async def settle_unanswered(
    rep: ReplicaState, name: str, settings: RouterSettings, clock: Callable[[], float]
) -> bool:
    """After an unanswered load call: True once the replica lists ``name`` (it loaded after
    all), within ``load_settle_s``; else False, after an unload. A replica whose listing is not
    the truth about what it holds is only waited for, then unloaded."""
    driver = rep.driver
    deadline = clock() + settings.load_settle_s
    while True:
        if driver.capabilities.lists_adapters:
            with contextlib.suppress(DriverError, TimeoutError):
                models = await driver.list_adapters(rep.url, settings.poll_timeout_s)
                if name in models.adapters:
                    return True
        left = deadline - clock()
        if left <= 0:
            break
        await asyncio.sleep(min(SETTLE_POLL_S, left))
    res = await driver.unload(rep.url, name, settings.load_timeout_s)
    if not res.ok:
        log.warning(
            "unload after an unanswered load failed",
            extra={"replica": rep.url, "lora_name": name, "error": res.message},
        )
    return False


class FailedLoads:
    def __init__(
        self, metrics: RouterMetrics, audit: RouterAudit, cluster: ClusterState, *, clock: Callable[[], float]
    ) -> None:
        self._metrics = metrics
        self._audit = audit
        self._cluster = cluster
        self._clock = clock

    def mark(self, rep: ReplicaState, lora_name: str, reason: str) -> None:
        """This process's record of a load that did not end resident: ``failed``, with why."""
        r = rep.residents.get(lora_name)
        if r is not None and r.state != "resident":
            rep.residents.change(lora_name, state="failed", reason=reason, since=self._clock())

    async def failed(
        self,
        rep: ReplicaState,
        version: VersionInfo,
        labels: dict[str, str],
        details: dict[str, Any],
        t0: float,
        failure: str,
        message: str,
        retry_elsewhere: bool,
    ) -> None:
        self.mark(rep, version.lora_name, failure)
        self._metrics.loads.labels(**labels, result=failure).inc()
        duration_ms = round((self._clock() - t0) * 1000, 1)
        log.warning("adapter load failed", extra={**details, "reason": failure, "error": message})
        await self._audit.event(
            "adapter.load_failed",
            version.adapter_id,
            {**details, "duration_ms": duration_ms, "reason": failure, "message": message[:500]},
        )
        await self._cluster.set_state(
            rep.url,
            version.lora_name,
            "failed",
            failure=failure,
            retry_elsewhere=retry_elsewhere,
            reason=message[:200],
        )
