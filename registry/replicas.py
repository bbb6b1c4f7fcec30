"""CONTRACT between the router (which knows the replicas) and the admin API (which shows them).

The registry must not import the router, so the admin routes ``GET /admin/v1/replicas`` and
``POST /admin/v1/adapters/{id}/prewarm`` talk to a ``ReplicaDirectory``. The router provides
the implementations (in-process for ``loraplane up``, Redis-backed across processes) in
``router.directory``; the admin app is given one at construction time, or None, in which
case those routes answer 503 ``replicas_unavailable``.
"""

from __future__ import annotations

from typing import Any, Protocol


class ReplicaDirectory(Protocol):
    async def list_replicas(self) -> list[dict[str, Any]]:
        """Replica records as SPEC §13: url, pool, base_model, healthy, adapters[], running, waiting,
        last_seen."""
        ...

    async def request_prewarm(self, adapter_id: str, version: str, replicas: int) -> dict[str, Any]:
        """Ask the router(s) to load ``adapter_id``/``version`` onto ``replicas`` replicas now.
        Returns a small JSON-able acknowledgement (e.g. targeted replica urls)."""
        ...
