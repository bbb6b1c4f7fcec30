"""Load-failure fallback (SPEC §15): what an adapter's ``on_load_failure`` policy serves when the
selected version cannot be (load failed, hash mismatch, load timeout, no capacity — after the
router's own retry).

- ``error`` (default): the failure stands (503 ``adapter_load_failed`` / ``no_capacity``).
- ``previous_version``: the version's ``rollback_to`` chain, first version that is not disabled
  and can be served (each tried once, at most ``MAX_CHAIN`` of them).
- ``base_model``: the bare base model.

Pinned ``BASE:ADAPTER@vN`` requests never fall back. Every fallback answer says so
(``ForwardResult.fallback`` and ``served_version``, which the gateway turns into the
``x-loraplane-fallback`` and ``x-loraplane-adapter-version`` headers), is counted in
``loraplane_fallbacks_total{adapter,version,kind,served_version}``, and is audited as
``adapter.fallback`` — at most one event per adapter, version and kind per ``AUDIT_EVERY_S``,
with the count of the fallbacks it stands for. The gateway's access log line and
``loraplane_gateway_requests_total`` carry both the version asked for and ``served_version``.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Awaitable, Callable

from registry.snapshot import RoutingSnapshot, VersionInfo
from router.audit import RouterAudit
from router.contract import ForwardRequest, ForwardResult, RouterError
from router.metrics import RouterMetrics

log = logging.getLogger("loraplane.router.fallback")

MAX_CHAIN = 3
AUDIT_EVERY_S = 60.0


class Fallback:
    def __init__(
        self,
        metrics: RouterMetrics,
        audit: RouterAudit,
        snapshot: Callable[[], RoutingSnapshot | None],
        *,
        clock: Callable[[], float],
    ) -> None:
        self._metrics = metrics
        self._audit = audit
        self._snapshot = snapshot
        self._clock = clock
        self._audited: dict[tuple[str, str, str], tuple[float, int]] = {}  # → (last event, since)

    def plan(self, req: ForwardRequest) -> tuple[str, list[VersionInfo | None]]:
        """(kind, what to try in order: versions, or None for the base model); no kind → []."""
        version = req.version
        snap = self._snapshot()
        adapter = snap.adapters.get(version.adapter_id) if version is not None and snap else None
        if version is None or req.pinned or adapter is None:
            return "", []
        if adapter.on_load_failure == "base_model":
            return "base_model", [None]
        if adapter.on_load_failure != "previous_version":
            return "", []
        chain: list[VersionInfo | None] = []
        seen = {version.version}
        name = version.rollback_to
        while name is not None and name not in seen and len(chain) < MAX_CHAIN:
            seen.add(name)
            prev = adapter.versions.get(name)
            if prev is None:
                break
            if prev.status != "disabled":
                chain.append(prev)
            name = prev.rollback_to
        return "previous_version", chain

    async def serve(
        self,
        req: ForwardRequest,
        error: RouterError,
        forward: Callable[[ForwardRequest], Awaitable[ForwardResult]],
    ) -> ForwardResult:
        """Serve ``req`` by its adapter's policy after ``error``; re-raises it when nothing can."""
        kind, options = self.plan(req)
        version = req.version
        if not kind or version is None:
            raise error
        for option in options:
            alt = dataclasses.replace(req, version=option, base_model=req.base_model)
            try:
                result = await forward(alt)
            except RouterError as exc:
                log.info(
                    "fallback could not be served either",
                    extra={"request_id": req.request_id, "kind": kind, "error": exc.message},
                )
                continue
            result.fallback = kind
            result.served_version = option.version if option is not None else "base"
            self._metrics.fallbacks.labels(
                adapter=version.adapter_id,
                version=version.version,
                kind=kind,
                served_version=result.served_version,
            ).inc()
            await self._note(version, kind, result.served_version, error)
            return result
        raise error

    async def _note(self, version: VersionInfo, kind: str, served: str, error: RouterError) -> None:
        key = (version.adapter_id, version.version, kind)
        now = self._clock()
        last = self._audited.get(key)
        if last is not None and now - last[0] < AUDIT_EVERY_S:
            self._audited[key] = (last[0], last[1] + 1)
            return
        count = 1 + (last[1] if last is not None else 0)
        self._audited[key] = (now, 0)
        log.warning(
            "served a fallback",
            extra={"adapter": version.adapter_id, "version": version.version, "kind": kind, "served": served},
        )
        await self._audit.event(
            "adapter.fallback",
            version.adapter_id,
            {
                "version": version.version,
                "kind": kind,
                "served": served,
                "count": count,
                "reason": error.message,
            },
        )
