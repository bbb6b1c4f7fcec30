"""In-process cluster state: the same rules as ``RedisCluster`` for one gateway process.

Used by the embedded default (``loraplane up``, no Redis) and by ``RedisCluster`` as its
fallback while Redis is unreachable (then each process decides alone, as SPEC §18 allows).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence

from router.cluster.base import OCCUPYING, Claim, LoadCaps, ReplicaShare
from router.placement.types import Residency, ResidencyState

FAILED_TTL_S = 30.0
GONE_TTL_S = 120.0  # how long an unload keeps stale poll answers from re-adding its record
LOADING = frozenset({"staging", "loading"})
NO_CAPS = LoadCaps()


class MemoryCluster:
    def __init__(
        self,
        pid: str = "local",
        *,
        wall: Callable[[], float] = time.time,
        counts: dict[tuple[str, str], int] | None = None,
    ) -> None:
        self.pid = pid
        self._wall = wall
        self._records: dict[str, dict[str, Residency]] = {}
        # in-flight per (url, lora_name) in this process (``RedisCluster`` shares its own dict)
        self._marks: dict[tuple[str, str], int] = {} if counts is None else counts
        self._pool_loads: dict[str, set[tuple[str, str]]] = {}  # pool → loads in flight
        self._pool_of: dict[tuple[str, str], str] = {}
        # (url, lora_name) → wall time it was unloaded or found missing: a poll asked before that
        # must not bring its record back (its answer may have been sent before the unload)
        self._gone: dict[tuple[str, str], float] = {}
        # loads whose call went unanswered: they occupy a slot but are not loads in flight
        self._settling: set[tuple[str, str]] = set()

    @property
    def shared(self) -> bool:
        return False

    async def start(self) -> None:
        return None

    async def stop(self) -> None:
        return None

    def _recs(self, url: str) -> dict[str, Residency]:
        recs = self._records.get(url)
        if recs is None:
            recs = self._records[url] = {}
        return recs

    def _put(
        self,
        url: str,
        lora_name: str,
        state: ResidencyState,
        *,
        failure: str = "",
        retry_elsewhere: bool = True,
        reason: str = "",
    ) -> None:
        self._recs(url)[lora_name] = Residency(
            lora_name=lora_name,
            state=state,
            pid=self.pid,
            ts=self._wall(),
            failure=failure,
            retry_elsewhere=retry_elsewhere,
            reason=reason,
        )

    def marks(self, url: str, lora_name: str) -> int:
        return self._marks.get((url, lora_name), 0)

    async def mark(self, url: str, lora_name: str) -> bool:
        rec = self._recs(url).get(lora_name)
        if rec is not None and rec.state == "unloading":
            return False
        key = (url, lora_name)
        self._marks[key] = self._marks.get(key, 0) + 1
        return True

    def unmark(self, url: str, lora_name: str) -> None:
        key = (url, lora_name)
        left = self._marks.get(key, 0) - 1
        if left > 0:
            self._marks[key] = left
        else:
            self._marks.pop(key, None)

    async def claim(
        self,
        url: str,
        lora_name: str,
        max_adapters: int,
        candidates: Sequence[str],
        since: float,
        caps: LoadCaps = NO_CAPS,
    ) -> Claim:
        recs = self._recs(url)
        rec = recs.get(lora_name)
        if rec is not None:
            if rec.state in OCCUPYING:
                return Claim("present", rec)
            if rec.ts >= since:
                return Claim("failed", rec)
        loading = sum(1 for n, r in recs.items() if r.state in LOADING and (url, n) not in self._settling)
        if caps.per_replica and loading >= caps.per_replica:
            return Claim("busy", busy="replica")
        if caps.per_pool and len(self._pool_loads.get(caps.pool, ())) >= caps.per_pool:
            return Claim("busy", busy="pool")
        count = sum(1 for r in recs.values() if r.state in OCCUPYING)
        chosen: list[str] = []
        if count >= max_adapters:
            need = count - max_adapters + 1
            for name in candidates:
                if len(chosen) == need:
                    break
                v = recs.get(name)
                idle = v is not None and v.state == "resident" and self.marks(url, name) == 0
                if idle and name not in chosen:
                    chosen.append(name)
            if len(chosen) < need:
                return Claim("full")
            for name in chosen:
                self._put(url, name, "unloading")
        self._put(url, lora_name, "staging")
        if caps.per_pool:
            self._pool_loads.setdefault(caps.pool, set()).add((url, lora_name))
            self._pool_of[(url, lora_name)] = caps.pool
        return Claim("reserved", evict=tuple(chosen))

    def _load_over(self, url: str, lora_name: str) -> None:
        pool = self._pool_of.pop((url, lora_name), None)
        if pool is not None:
            self._pool_loads.get(pool, set()).discard((url, lora_name))

    async def set_state(
        self,
        url: str,
        lora_name: str,
        state: ResidencyState,
        *,
        failure: str = "",
        retry_elsewhere: bool = True,
        reason: str = "",
        settling: bool = False,
    ) -> None:
        self._put(url, lora_name, state, failure=failure, retry_elsewhere=retry_elsewhere, reason=reason)
        if settling:
            self._settling.add((url, lora_name))
        else:
            self._settling.discard((url, lora_name))
        if state not in LOADING or settling:
            self._load_over(url, lora_name)

    async def drop(self, url: str, lora_name: str) -> None:
        self._recs(url).pop(lora_name, None)
        self._settling.discard((url, lora_name))
        self._gone[(url, lora_name)] = self._wall()
        self._load_over(url, lora_name)

    async def record(self, url: str, lora_name: str) -> Residency | None:
        return self._recs(url).get(lora_name)

    async def begin_unload(self, url: str, lora_name: str) -> bool:
        rec = self._recs(url).get(lora_name)
        if rec is not None and rec.state != "resident":
            return False
        if self.marks(url, lora_name) > 0:
            return False
        self._put(url, lora_name, "unloading")
        return True

    async def end_unload(self, url: str, lora_name: str, ok: bool) -> None:
        if ok:
            self._recs(url).pop(lora_name, None)
            self._gone[(url, lora_name)] = self._wall()
        else:
            self._put(url, lora_name, "resident")

    async def sync_models(self, url: str, listed: Iterable[str], asked_at: float) -> None:
        recs = self._recs(url)
        names = set(listed)
        now = self._wall()
        for name, rec in list(recs.items()):
            vanished = rec.state == "resident" and name not in names and rec.ts < asked_at
            if vanished or (rec.state == "failed" and now - rec.ts > FAILED_TTL_S):
                del recs[name]
        for name in names:
            found = recs.get(name)
            if found is None and self._gone.get((url, name), float("-inf")) >= asked_at:
                continue  # unloaded after the question was asked: the answer is stale
            if found is None or found.state == "failed":
                self._put(url, name, "resident")
        for key, at in list(self._gone.items()):
            if now - at > GONE_TTL_S:
                del self._gone[key]

    async def read(self, urls: Sequence[str]) -> dict[str, ReplicaShare] | None:
        return None  # nothing beyond this process: the router's own records are the truth

    async def lead(self, name: str) -> bool:
        return True
