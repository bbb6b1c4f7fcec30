"""CONTRACT: how code outside the registry's request transactions (the router) records audit
events (``adapter.loaded``, ``adapter.unloaded``, ``adapter.load_failed``,
``adapter.hash_mismatch``). The registry implements it in ``registry.services.audit`` as
``DbAuditSink(session_factory)`` (each call: one short transaction, run off the event loop).
"""

from __future__ import annotations

from typing import Any, Protocol


class AuditSink(Protocol):
    async def record(
        self, *, actor: str, action: str, subject_type: str, subject_id: str, details: dict[str, Any]
    ) -> None: ...


class MemoryAuditSink:
    """For tests: keeps events in a list."""

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []

    async def record(
        self, *, actor: str, action: str, subject_type: str, subject_id: str, details: dict[str, Any]
    ) -> None:
        self.events.append(
            {
                "actor": actor,
                "action": action,
                "subject_type": subject_type,
                "subject_id": subject_id,
                "details": details,
            }
        )
