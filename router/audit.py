"""The router's audit events (actor ``router``, ``subject_type`` ``adapter``).

Writing one never breaks routing: a failing sink is logged and the request goes on (the
production sink buffers, see ``registry.audit_sink.BufferedAuditSink``).
"""

from __future__ import annotations

import logging
from typing import Any

from registry.audit_sink import AuditSink

log = logging.getLogger("loraplane.router.audit")

ACTOR = "router"


class RouterAudit:
    def __init__(self, sink: AuditSink) -> None:
        self._sink = sink

    async def event(self, action: str, adapter_id: str, details: dict[str, Any]) -> None:
        try:
            await self._sink.record(
                actor=ACTOR, action=action, subject_type="adapter", subject_id=adapter_id, details=details
            )
        except Exception as exc:  # the audit sink must never break routing
            log.warning("audit record failed", extra={"action": action, "error": str(exc)})
