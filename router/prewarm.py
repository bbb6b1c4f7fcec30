"""Prewarm: have a version on N healthy replicas now — the holders first, then placement's picks,
each loaded in the background through the normal (cluster-claimed, verified) load path."""

from __future__ import annotations

import asyncio
import logging

from registry.snapshot import VersionInfo
from router.loader import Loader
from router.planner import Planner
from router.store import ReplicaStore

log = logging.getLogger("loraplane.router")


class Prewarmer:
    def __init__(self, store: ReplicaStore, planner: Planner, loader: Loader) -> None:
        self._store = store
        self._planner = planner
        self._loader = loader

    async def prewarm(
        self, info: VersionInfo, replicas: int, *, exclude: set[str] | frozenset[str], strict_hot: bool
    ) -> list[str]:
        """Have ``info`` on ``replicas`` healthy replicas: those that hold it, then placement's
        picks (never one in ``exclude``), each loaded in the background. ``strict_hot``: no load
        that would evict a copy another hot version needs (the reconciler's hot prewarm)."""
        name = info.lora_name
        reps = [r for r in self._store.for_base(info.base_model) if r.healthy]
        have = [
            r.url
            for r in reps
            if ((res := r.residents.get(name)) is not None and res.state != "failed")
            or self._loader.in_flight(r.url, name)
        ]
        targets = list(have[:replicas])
        excluded = set(have) | set(exclude)
        while len(targets) < replicas:
            got = self._planner.place_copy(info, reps, excluded, strict_hot=strict_hot)
            if got is None:
                break
            rep, decision = got
            excluded.add(rep.url)
            targets.append(rep.url)
            cands = self._planner.candidates(rep, decision, name, strict_hot=strict_hot)
            self._loader.start_load(rep, info, cands).add_done_callback(self._prewarm_done)
        return targets

    @staticmethod
    def _prewarm_done(task: asyncio.Task[None]) -> None:
        if not task.cancelled() and (exc := task.exception()) is not None:
            log.warning("prewarm failed", extra={"task": task.get_name(), "error": str(exc)})
