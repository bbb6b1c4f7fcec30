"""CONTRACT between the router (which knows the replicas) and the admin API (which shows them).

The registry must not import the router, so the admin routes ``GET /admin/v1/replicas``,
``GET /admin/v1/replicas/plan`` and ``POST /admin/v1/adapters/{id}/prewarm`` talk to a
``ReplicaDirectory``. The router provides the implementations (in-process for ``loraplane up``,
Redis-backed across processes) in ``router.directory``; the admin app is given one at
construction time, or None, in which case those routes answer 503 ``replicas_unavailable``.
"""

from __future__ import annotations

from typing import Any, Protocol


class ReplicaDirectory(Protocol):
    async def list_replicas(self) -> list[dict[str, Any]]:
        """Replica records as SPEC §13: url, pool, base_model, healthy, adapters[], running, waiting,
        last_seen."""
        ...

    async def plan(self) -> dict[str, Any]:
        """The placement plan the cluster's chore leader published, for operators:
        ``published`` (False while no plan is out: the controller is off, or has not planned yet),
        ``at`` (ISO time it was made), ``age_s``, ``desired_replicas`` (pool → replicas: the
        autoscaling signal), ``overflow`` (copies wanted that found no slot) and ``adapters``, busiest
        first: adapter, version, lora_name, demand_rps (forecast), planned_replicas, targets (replica
        urls), current ([{url, state}] where it is staging/loading/resident now), missing (targets
        not holding it yet)."""
        ...

    async def request_prewarm(self, adapter_id: str, version: str, replicas: int) -> dict[str, Any]:
        """Ask the router(s) to load ``adapter_id``/``version`` onto ``replicas`` replicas now.
        Returns a small JSON-able acknowledgement (e.g. targeted replica urls)."""
        ...
