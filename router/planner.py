"""Planner: turns a request into the placement profile's input and its decision into a replica.

The placement input carries everything the decision depends on (DESIGN example 17): the
replicas' views (health, scraped load, residency with cluster-wide in-flight counts) and the
hot-copy targets; the decision carries every action (the replica, and the victims to evict).
With the default profile and at least ``INDEX_MIN_REPLICAS`` replicas the decision comes from a
placement index per base model (``router/placement/index.py``) updated with the replicas the
store reports changed, so it does not visit every replica; it is the decision the full pass over
the views would make (which smaller clusters take: there it is the cheaper of the two).
The runtime executes it: the loader's cluster ``claim`` evicts the decision's victims — and,
only when this process's view was stale and the replica holds more than it knew, the next
idle adapters in LRU order (``candidates``), never a hot copy for a prewarm.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from registry.snapshot import VersionInfo
from router.contract import ForwardRequest, NoCapacity
from router.hotness import HotSet
from router.metrics import RouterMetrics
from router.placement.fused import DefaultProfile
from router.placement.index import PlacementIndex
from router.placement.index_pick import pick as pick_indexed
from router.placement.types import Decision, PlacementRequest, Profile
from router.store import ReplicaState, ReplicaStore, views


class ColdSlotsFull(NoCapacity):
    """Only the GPU slots reserved for hot adapters are free (``reserved_hot_slots``)."""


INDEX_MIN_REPLICAS = 64


class Planner:
    def __init__(
        self,
        store: ReplicaStore,
        profile: Profile,
        hot: HotSet,
        metrics: RouterMetrics,
        *,
        clock: Callable[[], float],
    ) -> None:
        self._store = store
        self.profile = profile
        self._hot = hot
        self._metrics = metrics
        self._clock = clock
        self._counters: dict[str, Any] = {}
        self._indexes: dict[str, PlacementIndex] = {}  # base model → its replicas' index
        self.use_index = True  # False: always the full pass (benchmarks compare the two)
        # Below this many replicas the full pass is the cheaper of the two (same decisions): at
        # 10 replicas it took half the index's time, at 100 as long (benchmarks/placement.py).
        self.index_min_replicas = INDEX_MIN_REPLICAS

    def place(self, req: ForwardRequest, excluded: set[str]) -> tuple[ReplicaState, Decision]:
        """The replica for ``req`` (never one in ``excluded``); raises NoCapacity (``ColdSlotsFull``
        when only the slots reserved for hot adapters are left)."""
        version = req.version
        if version is not None:  # not where loads are paused (a replica refusing them)
            excluded = self._store.load_exclusions(req.base_model, version.lora_name, excluded)
        body = req.body
        max_tokens = body.get("max_tokens") or body.get("max_completion_tokens") or 0
        preq = PlacementRequest(
            lora_name=version.lora_name if version else None,
            adapter_id=version.adapter_id if version else None,
            size_bytes=version.total_bytes if version else 0,
            max_tokens=max_tokens if isinstance(max_tokens, int) else 0,
            exclude=frozenset(excluded),
            hot_targets=self._hot.targets,
        )
        ix = self._index(req.base_model, reserved=version is not None)
        if ix is not None:  # the same decision as the full pass below, from the index
            if ix.healthy <= len(ix.excluded(preq.exclude)):
                raise NoCapacity(f"no healthy replica for base model {req.base_model}", retry_after=2)
            decision = pick_indexed(ix, preq, self._clock())
        else:
            reps = [r for r in self._store.for_base(req.base_model) if r.healthy and r.url not in excluded]
            if not reps:
                raise NoCapacity(f"no healthy replica for base model {req.base_model}", retry_after=2)
            if version is not None and reps[0].pool.reserved_hot_slots > 0:
                reps = self._outside_hot_slots(reps, version.lora_name)
            decision = self.profile.pick(preq, views(reps), self._clock())
        rep = self._store.replicas.get(decision.replica) if decision.replica is not None else None
        if rep is None:
            raise NoCapacity(f"no capacity for {req.client_model}: {decision.reason or 'all replicas busy'}")
        outcome = decision.action if decision.action != "none" else "hit"
        counter = self._counters.get(outcome)
        if counter is None:  # the labelled child, looked up once per outcome (labels() is slow)
            counter = self._counters[outcome] = self._metrics.placement.labels(outcome=outcome)
        counter.inc()
        return rep, decision

    def _index(self, base_model: str, *, reserved: bool) -> PlacementIndex | None:
        """The placement index of ``base_model``'s replicas, up to date with the store's changes;
        None when the profile has none (not the default pipeline) or when ``reserved`` (an
        adapter request) and a pool keeps GPU slots for hot adapters (a per-request filter the
        index does not cover: the full pass runs)."""
        profile = self.profile
        if not self.use_index or not isinstance(profile, DefaultProfile) or not profile._planned():
            return None
        if len(self._store.replicas) < self.index_min_replicas:
            return None  # changes wait in the store until the cluster grows
        if reserved and any(p.reserved_hot_slots > 0 for p in self._store.pools_for(base_model)):
            return None
        store = self._store
        indexes = self._indexes
        if store.changes:
            for url in store.take_changes():
                rep = store.replicas.get(url)
                for base, other in indexes.items():
                    for slot in other.slots.get(url, ()):
                        if rep is None or slot != rep.seq or base != rep.pool.base_model:
                            other.put(slot, None)
                ix = indexes.get(rep.pool.base_model) if rep is not None else None
                if rep is not None and ix is not None:
                    ix.put(rep.seq, rep.view())
        ix = indexes.get(base_model)
        if ix is None or not ix.valid():
            ix = indexes[base_model] = PlacementIndex(profile)
            for rep in store.for_base(base_model):
                ix.put(rep.seq, rep.view())
        return ix

    def _outside_hot_slots(self, reps: list[ReplicaState], name: str) -> list[ReplicaState]:
        """The replicas where an adapter that is not hot may run without taking one of the
        ``reserved_hot_slots`` of their ``max_loras`` (SPEC §15): those where it runs already, or
        where fewer cold adapters than ``max_loras - reserved_hot_slots`` are running."""
        hot = self._hot.targets
        if name in hot:
            return reps
        out = []
        for rep in reps:
            mine = rep.residents.get(name)
            if mine is not None and mine.inflight + mine.remote_inflight > 0:
                out.append(rep)
                continue
            cold_running = sum(
                1
                for r in rep.residents.values()
                if r.inflight + r.remote_inflight > 0 and r.lora_name not in hot
            )
            if cold_running < rep.pool.max_loras - rep.pool.reserved_hot_slots:
                out.append(rep)
        if not out:
            raise ColdSlotsFull(
                "every replica's free GPU slots are reserved for hot adapters; retry shortly", retry_after=1
            )
        return out

    def place_copy(
        self, info: VersionInfo, candidates: list[ReplicaState], exclude: set[str], *, strict_hot: bool
    ) -> tuple[ReplicaState, Decision] | None:
        """Where one more copy of ``info`` goes (a prewarm), or None when no replica can take it
        (with ``strict_hot``: not without evicting another hot copy)."""
        cands = self._store.load_targets([r for r in candidates if r.url not in exclude], info.lora_name)
        if not cands:
            return None
        preq = PlacementRequest(
            lora_name=info.lora_name,
            adapter_id=info.adapter_id,
            size_bytes=info.total_bytes,
            exclude=frozenset(exclude),
            hot_targets=self._hot.targets,
            strict_hot=strict_hot,
        )
        d = self.profile.pick(preq, views(cands), self._clock())
        rep = self._store.replicas.get(d.replica) if d.replica is not None else None
        return None if rep is None else (rep, d)

    def candidates(
        self, rep: ReplicaState, decision: Decision, lora_name: str, *, strict_hot: bool
    ) -> tuple[str, ...]:
        """The decision's victims, then (for a stale view only) other idle residents, LRU first;
        hot copies last, and none at all when ``strict_hot``."""
        out = [v for v in decision.evict if v != lora_name]
        seen = set(out)
        idle = sorted(
            (
                r
                for r in rep.residents.values()
                if r.state == "resident"
                and r.inflight + r.remote_inflight == 0
                and r.lora_name != lora_name
                and r.lora_name not in seen
            ),
            key=lambda r: r.last_used,
        )
        targets = self._hot.targets
        out.extend(r.lora_name for r in idle if r.lora_name not in targets)
        if not strict_hot:
            out.extend(r.lora_name for r in idle if r.lora_name in targets)
        return tuple(out)
