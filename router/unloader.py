"""Unloader: takes an adapter version off a replica, never under a request of any process.

An unload first takes the adapter out of use cluster-wide (``ClusterState.begin_unload``,
refused while any live gateway process has a request in flight for it there, or it is
loading), then asks the engine (404 = already gone, fine), records the result in the cluster
state, writes ``adapter.unloaded`` (``reason`` ``evict`` | ``disabled`` | ``retired``) and
removes the staged files once no replica sharing the staging location still uses them.
Eviction victims that the loader's cluster ``claim`` already marked ``unloading`` go straight
to ``engine_unload``.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable

from router.audit import RouterAudit
from router.cluster import ClusterState
from router.metrics import RouterMetrics
from router.settings import RouterSettings
from router.staging import Stager, StagingError
from router.store import ReplicaState, ReplicaStore

log = logging.getLogger("loraplane.router.loader")


class Unloader:
    def __init__(
        self,
        settings: RouterSettings,
        store: ReplicaStore,
        stagers: dict[str, Stager],
        audit: RouterAudit,
        metrics: RouterMetrics,
        cluster: ClusterState,
    ) -> None:
        self._settings = settings
        self._store = store
        self._stagers = stagers
        self._audit = audit
        self._metrics = metrics
        self._cluster = cluster
        self._unloading: set[tuple[str, str]] = set()
        # (url, lora_name) evicted from an engine that reloads names by itself: the staged files
        # stayed; they go once the version no longer serves by default (``drop_kept``)
        self._kept: dict[tuple[str, str], ReplicaState] = {}

    def busy(self, url: str, lora_name: str) -> bool:
        return (url, lora_name) in self._unloading

    async def unload(self, rep: ReplicaState, lora_name: str, reason: str) -> bool:
        """Unload ``lora_name`` from ``rep`` unless a request of any gateway process uses it there
        (or it is loading); 404 = already gone, fine. Cleans its staged files."""
        r = rep.residents.get(lora_name)
        if r is not None and (r.state in ("staging", "loading", "unloading") or rep.in_use(lora_name) > 0):
            return False
        if self.busy(rep.url, lora_name) or not await self._cluster.begin_unload(rep.url, lora_name):
            return False
        return await self.engine_unload(rep, lora_name, reason)

    async def engine_unload(self, rep: ReplicaState, lora_name: str, reason: str) -> bool:
        """Ask the engine to unload (the cluster record is already ``unloading``)."""
        key = (rep.url, lora_name)
        self._unloading.add(key)
        try:
            r = rep.residents.change(lora_name, state="unloading")
            res = await rep.driver.unload(rep.url, lora_name, self._settings.poll_timeout_s * 5)
            await self._cluster.end_unload(rep.url, lora_name, res.ok)
        finally:
            self._unloading.discard(key)
        if not res.ok:
            if r is not None and rep.residents.get(lora_name) is r:
                rep.residents.change(lora_name, state="resident")
            log.warning(
                "adapter unload failed",
                extra={"replica": rep.url, "lora_name": lora_name, "error": res.message},
            )
            return False
        self._store.note_gone(rep, lora_name)
        if rep.residents.get(lora_name) is r:
            rep.residents.pop(lora_name, None)
        adapter_id = r.adapter_id if r else lora_name.split("@", 1)[0]
        version = r.version if r else ""
        if not res.already_gone:
            self._metrics.unloads.labels(
                replica=rep.url, adapter=adapter_id, version=version, reason=reason
            ).inc()
            log.info(
                "adapter unloaded",
                extra={
                    "replica": rep.url,
                    "lora_name": lora_name,
                    "reason": reason,
                    "gateway_process": self._cluster.pid,
                },
            )
            await self._audit.event(
                "adapter.unloaded",
                adapter_id,
                {"version": version, "replica": rep.url, "lora_name": lora_name, "reason": reason},
            )
        if reason != "evict" or not rep.driver.capabilities.implicit_reload:
            await self._cleanup(rep, lora_name)
        else:  # the engine may reload the name by itself from these files: they stay for now
            self._kept[(rep.url, lora_name)] = rep
        return True

    async def drop_kept(self, serves: Callable[[str], bool]) -> None:
        """Remove the files kept after evictions (an engine with ``implicit_reload``) of versions
        that no longer serve by default (``serves(lora_name)`` False: retired, disabled, gone)."""
        for key, rep in list(self._kept.items()):
            url, lora_name = key
            if serves(lora_name):
                continue
            del self._kept[key]
            if self._store.replicas.get(url) is rep and lora_name not in rep.residents:
                await self._cleanup(rep, lora_name)

    async def _cleanup(self, rep: ReplicaState, lora_name: str) -> None:
        """Remove staged files once no replica sharing the staging location still uses them —
        as this process sees it, and as the cluster's records say (another gateway process may be
        staging or loading the same files onto one of them right now)."""
        local = rep.pool.staging.mode != "agent"  # one directory (or published prefix) for the pool
        sharing = [
            other.url
            for other in self._store.replicas.values()
            if other.pool.name == rep.pool.name and (local or other.host == rep.host)
        ]
        if any(lora_name in self._store.replicas[u].residents for u in sharing):
            return
        shares = await self._cluster.read(sharing)
        if shares is not None and any(lora_name in s.records for s in shares.values()):
            return
        with contextlib.suppress(StagingError, OSError):
            await self._stagers[rep.pool.name].remove(rep.host, lora_name)
