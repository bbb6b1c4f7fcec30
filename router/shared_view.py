"""Keeps this process's replica records in step with the cluster's (``ClusterState.read``).

Every ``cluster_sync_s`` one round trip reads every replica's shared residency records and
the in-flight marks of the other gateway processes; placement then decides on local copies
whose staleness is bounded by that period (the atomic checks of ``ClusterState`` make acting
on them safe). Records with a load or unload of this process in progress are left alone: this
process knows better.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from router.cluster import ClusterState, ReplicaShare
from router.placement.types import Residency
from router.store import ReplicaState, ReplicaStore, parse_lora_name

log = logging.getLogger("loraplane.router.shared_view")


class SharedView:
    def __init__(
        self,
        store: ReplicaStore,
        cluster: ClusterState,
        *,
        busy: Callable[[str, str], bool],
        clock: Callable[[], float],
        interval_s: float,
    ) -> None:
        self._store = store
        self._cluster = cluster
        self._busy = busy
        self._clock = clock
        self._interval = interval_s
        self.synced_at: float | None = None  # clock time of the last applied read

    async def run(self) -> None:
        while True:
            try:
                await self.sync_once()
            except asyncio.CancelledError:
                raise
            except Exception:  # never let one bad read stop the loop
                log.exception("cluster state sync failed")
            await asyncio.sleep(self._interval)

    async def sync_once(self) -> None:
        reps = list(self._store.replicas.values())
        asked = self._clock()
        shares = await self._cluster.read([r.url for r in reps])
        if shares is None:
            return
        for rep in reps:
            share = shares.get(rep.url)
            if share is not None:
                self.apply(rep, share, asked)
        self.synced_at = asked

    def apply(self, rep: ReplicaState, share: ReplicaShare, asked: float) -> None:
        now = self._clock()
        residents = rep.residents
        for name, rec in share.records.items():
            remote = share.remote_marks.get(name, 0)
            rep.set_remote(name, remote)
            r = residents.get(name)
            if r is None:
                parsed = parse_lora_name(name)
                if parsed is None:
                    continue
                residents[name] = Residency(
                    lora_name=name,
                    adapter_id=parsed[0],
                    version=parsed[1],
                    state=rec.state,
                    since=now,
                    last_used=now,
                    reason=rec.failure,
                )
                continue
            changes: dict[str, object] = {}
            if remote:
                changes["last_used"] = now  # in use by another process: recently used cluster-wide
            if r.state != rec.state and r.since <= asked and not self._busy(rep.url, name):
                changes["state"] = rec.state
            if changes:
                residents.change(name, **changes)
        for name in list(rep.remote):
            if name not in share.records:
                rep.set_remote(name, 0)
        for name, r in list(residents.items()):
            if (
                name not in share.records
                and r.since <= asked
                and rep.local.get(name, 0) == 0
                and not self._busy(rep.url, name)
            ):
                del residents[name]
