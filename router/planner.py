"""Planner: turns a request into the placement profile's input and its decision into a replica.

The placement input carries everything the decision depends on (DESIGN example 17): the
replicas' views (health, scraped load, residency with cluster-wide in-flight counts), the
hot-copy targets, the placement plan (``plan``, set by ``router.controller``) and the prompt
prefix each replica holds for the adapter (``router.prefix``); the decision carries every
action (the replica, and the victims to evict). With the ``default`` profile the decision is
made on a ``ReplicaTable`` per base model, kept up to date with the replicas the store reports
changed, so it never visits every replica; other profiles get the list of views.

The runtime executes it: the loader's cluster ``claim`` evicts the decision's victims — and,
only when this process's view was stale and the replica holds more than it knew, the next
idle adapters in LRU order (``candidates``), never a hot or planned copy for a prewarm.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from prometheus_client import Counter

from registry.snapshot import VersionInfo
from router.contract import ForwardRequest, NoCapacity
from router.hotness import HotSet
from router.metrics import RouterMetrics
from router.placement.default import DefaultPolicy
from router.placement.table import ReplicaTable
from router.placement.types import Decision, PlacementRequest, Profile
from router.prefix import CHARS_PER_TOKEN, PrefixIndex, prompt_text, served_seed
from router.store import ReplicaState, ReplicaStore, views

__all__ = ["ColdSlotsFull", "Planner", "SlotsInUse"]


class ColdSlotsFull(NoCapacity):
    """Only the GPU slots reserved for hot adapters are free (``reserved_hot_slots``)."""


class SlotsInUse(NoCapacity):
    """Healthy replicas could take the adapter, but none can right now (every adapter there is
    serving requests, or loads are in flight): transient, worth a bounded wait."""


class Planner:
    def __init__(
        self,
        store: ReplicaStore,
        profile: Profile,
        hot: HotSet,
        metrics: RouterMetrics,
        *,
        clock: Callable[[], float],
        prefix: PrefixIndex | None = None,
    ) -> None:
        self._store = store
        self.profile = profile
        self._hot = hot
        self._metrics = metrics
        self._clock = clock
        self.prefix = prefix if prefix is not None else PrefixIndex()
        self.plan: Mapping[str, frozenset[str]] = {}  # lora_name → planned replicas (the controller)
        self.tables: dict[str, ReplicaTable] = {}  # base model → its replicas (``tables()``)
        self._outcomes: dict[str, Counter] = {}
        self._tiers: dict[tuple[str, str], Counter] = {}

    def place(self, req: ForwardRequest, excluded: set[str]) -> tuple[ReplicaState, Decision]:
        """The replica for ``req`` (never one in ``excluded``); raises NoCapacity (``ColdSlotsFull``
        when only the slots reserved for hot adapters are left)."""
        version = req.version
        name = version.lora_name if version is not None else None
        if name is not None:  # not where loads are paused (a replica refusing them)
            excluded = self._store.load_exclusions(req.base_model, name, excluded)
            if any(p.reserved_hot_slots > 0 for p in self._store.pools_for(req.base_model)):
                excluded = excluded | self._hot_slot_exclusions(req.base_model, name, excluded)
        body = req.body
        max_tokens = body.get("max_tokens") or body.get("max_completion_tokens") or 0
        text = prompt_text(body)
        now = self._clock()
        hashes = self.prefix.hashes(served_seed(name, req.base_model), text)
        preq = PlacementRequest(
            lora_name=name,
            adapter_id=version.adapter_id if version else None,
            size_bytes=version.total_bytes if version else 0,
            prompt_tokens=len(text) // CHARS_PER_TOKEN,
            max_tokens=max_tokens if isinstance(max_tokens, int) else 0,
            exclude=frozenset(excluded),
            hot_targets=self._hot.targets,
            plan=self.plan,
            prefix=self.prefix.match(hashes, now) if hashes else {},
            rank=version.rank if version else 0,
        )
        decision = self._decide(req.base_model, preq, now)
        rep = self._store.replicas.get(decision.replica) if decision.replica is not None else None
        if rep is None:
            healthy = [r for r in self._store.for_base(req.base_model) if r.healthy and r.url not in excluded]
            if not healthy:
                raise NoCapacity(f"no healthy replica for base model {req.base_model}", retry_after=2)
            message = f"no capacity for {req.client_model}: {decision.reason or 'all replicas busy'}"
            rank = version.rank if version is not None else 0
            if any(r.pool.max_lora_rank is None or rank <= r.pool.max_lora_rank for r in healthy):
                raise SlotsInUse(message)
            raise NoCapacity(message)
        if hashes:
            self.prefix.record(hashes, rep.url, now)
        self._count(rep.pool.name, decision)
        return rep, decision

    def _decide(self, base_model: str, preq: PlacementRequest, now: float) -> Decision:
        profile = self.profile
        if isinstance(profile, DefaultPolicy):
            return profile.decide(self.table(base_model), preq, now)
        reps = [r for r in self._store.for_base(base_model) if r.healthy and r.url not in preq.exclude]
        if not reps:
            return Decision(replica=None, action="none", reason="no healthy replica")
        return profile.pick(preq, views(reps), now)

    def _count(self, pool: str, decision: Decision) -> None:
        """Placement outcome and tier counters (labelled children looked up once: labels() is slow)."""
        outcome = decision.action if decision.action != "none" else "hit"
        child = self._outcomes.get(outcome)
        if child is None:
            child = self._outcomes[outcome] = self._metrics.placement.labels(outcome=outcome)
        child.inc()
        if decision.tier:
            tier = self._tiers.get((pool, decision.tier))
            if tier is None:
                tier = self._tiers[(pool, decision.tier)] = self._metrics.tiers.labels(
                    pool=pool, tier=decision.tier
                )
            tier.inc()

    def table(self, base_model: str) -> ReplicaTable:
        """The replica table of ``base_model``, up to date with the store's changes."""
        store = self._store
        tables = self.tables
        if store.changes:
            for url in store.take_changes():
                rep = store.replicas.get(url)
                for base, t in tables.items():
                    if url in t.views and (rep is None or rep.pool.base_model != base):
                        t.remove(url)
                if rep is None:
                    self.prefix.forget(url)
                    continue
                known = tables.get(rep.pool.base_model)
                if known is not None:
                    known.put(rep.view())
        table = tables.get(base_model)
        if table is None:
            table = tables[base_model] = ReplicaTable()
            for rep in store.for_base(base_model):
                table.put(rep.view())
        return table

    def _hot_slot_exclusions(self, base_model: str, name: str, excluded: set[str]) -> set[str]:
        """The replicas where an adapter that is not hot may not run without taking one of the
        ``reserved_hot_slots`` of their ``max_loras`` (SPEC §15): where it does not run already
        and the cold adapters running fill ``max_loras - reserved_hot_slots``. Raises
        ``ColdSlotsFull`` when that leaves no replica."""
        hot = self._hot.targets
        if name in hot:
            return set()
        out: set[str] = set()
        reps = [r for r in self._store.for_base(base_model) if r.healthy and r.url not in excluded]
        for rep in reps:
            if rep.in_use(name) > 0:
                continue
            cold_running = sum(1 for n in rep.residents if rep.in_use(n) > 0 and n not in hot)
            if cold_running >= rep.pool.max_loras - rep.pool.reserved_hot_slots:
                out.add(rep.url)
        if reps and len(out) == len(reps):
            raise ColdSlotsFull(
                "every replica's free GPU slots are reserved for hot adapters; retry shortly", retry_after=1
            )
        return out

    def place_copy(
        self, info: VersionInfo, candidates: list[ReplicaState], exclude: set[str], *, strict_hot: bool
    ) -> tuple[ReplicaState, Decision] | None:
        """Where one more copy of ``info`` goes (a prewarm or a load of the plan), or None when no
        replica of ``candidates`` can take it (with ``strict_hot``: not without evicting a hot or
        planned copy)."""
        cands = self._store.load_targets([r for r in candidates if r.url not in exclude], info.lora_name)
        if not cands:
            return None
        allowed = {r.url for r in cands}
        others = {r.url for r in self._store.for_base(info.base_model)} - allowed
        preq = PlacementRequest(
            lora_name=info.lora_name,
            adapter_id=info.adapter_id,
            size_bytes=info.total_bytes,
            exclude=frozenset(exclude | others),
            hot_targets=self._hot.targets,
            strict_hot=strict_hot,
            plan=self.plan,
            rank=info.rank,
        )
        now = self._clock()
        profile = self.profile
        if isinstance(profile, DefaultPolicy):
            d = profile.decide(self.table(info.base_model), preq, now)
        else:
            d = profile.pick(preq, views(cands), now)
        rep = self._store.replicas.get(d.replica) if d.replica is not None else None
        return None if rep is None or rep.url not in allowed else (rep, d)

    def candidates(
        self, rep: ReplicaState, decision: Decision, lora_name: str, *, strict_hot: bool
    ) -> tuple[str, ...]:
        """The decision's victims, then (for a stale view only) other idle residents, LRU first;
        hot and planned copies last, and none at all when ``strict_hot``."""
        out = [v for v in decision.evict if v != lora_name]
        seen = set(out)
        idle = sorted(
            (
                r
                for r in rep.residents.values()
                if r.state == "resident"
                and rep.in_use(r.lora_name) == 0
                and r.lora_name != lora_name
                and r.lora_name not in seen
            ),
            key=lambda r: r.last_used,
        )
        hot = self._hot.targets
        plan = self.plan

        def kept(name: str) -> bool:
            return name in hot or rep.url in plan.get(name, ())

        out.extend(r.lora_name for r in idle if not kept(r.lora_name))
        if not strict_hot:
            out.extend(r.lora_name for r in idle if kept(r.lora_name))
        return tuple(out)
