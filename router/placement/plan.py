"""The placement plan: which replicas should hold each adapter version — data, from a snapshot.

``make_plan(tables, demands, previous, params, now)`` is a pure function (DESIGN.md example
22): the placement controller (``router.controller``, run by the cluster's chore leader) calls
it every ``plan_interval_s`` with the replica tables of every base model and each adapter
version's forecast demand (every gateway's counts, ``router.placement.forecast``), publishes the
``Plan``, and executes ``actions(plan, tables)`` — the loads that bring residency to the plan
*before* demand arrives. Every gateway process reads the published plan: the default policy
prefers an adapter's planned replicas (``PlacementRequest.plan``), every evictor keeps planned
copies, and the request-time policy's reactive loads remain for what the forecast missed.

How a plan is made, per base model:

1. **Which adapters.** Versions forecast at ≥ ``min_rps``, hot ones (marked in the registry or
   measured hot: ``min_copies``) first, then by forecast rate — as many as the slots allow: hot
   ones may fill every ``max_adapters`` slot, the others ``plan_share`` × ``max_adapters`` per
   healthy replica (the rest of each replica stays a cache for the reactive path); and a cold
   adapter only where the cold ones expected to run at once leave the ``reserved_hot_slots`` of
   ``max_loras`` to hot ones.
2. **How many copies.** ``ceil(concurrency / (copy_share × max_num_seqs))`` where concurrency is
   the larger of the adapter's cluster-wide in-flight requests and its forecast rate times the
   pool's mean time in flight (Little's law), at least ``min_copies`` and 1, at most the healthy
   replicas. **Hysteresis**: more copies at once; fewer only after ``scale_down_ticks`` plans in
   a row wanted fewer.
3. **Which replicas** (stable under churn): candidates in the adapter's stable order on the
   table's consistent-hash ring, plus its previous targets and current holders; each priced
   ``rank_cost × position + new_load_cost (0 where it is registered already) − keep_reward (a
   previous target) + busy_cost × expected running adapters there / max_loras``, the cheapest
   with a planned slot left taken, one copy at a time (greedy; Dynamo's solver is a min-cost
   flow with the same cost terms). A replica joining or leaving moves only the adapters whose
   ring positions or previous targets it touches.
4. **Desired replicas** per pool (the autoscaling signal): the most of (a) forecast concurrency
   over ``target_util × max_num_seqs``, (b) the adapters expected to be running at once (each
   running with probability 1 − e^(−concurrency)) over ``target_util × max_loras``, and (c) while
   requests queue on the replicas (scraped waiting), one more than the healthy replicas.

``actions`` diffs a plan against residency: a ``load`` per planned replica not holding its
adapter, an ``unload`` per idle copy the previous plan had there and this one moved to another
replica (same number of copies or more, the adapter present on its new targets). A copy the
plan no longer wants (fewer copies, or the adapter no longer planned) stays registered — an
idle registered adapter costs nothing until an evictor needs its slot. Everything else is left
to the request path.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from router.placement.table import ReplicaTable
from router.placement.types import ReplicaView

PRESENT = frozenset({"staging", "loading", "resident"})


@dataclass(frozen=True, slots=True)
class Demand:
    """One adapter version's demand, cluster-wide, as the controller forecasts it."""

    lora_name: str
    adapter_id: str
    version: str
    base_model: str
    rate: float  # forecast requests per second
    inflight: int = 0  # requests in flight now, every replica and gateway process
    min_copies: int = 0  # hot adapters: the copies the cluster keeps warm
    size_bytes: int = 0
    rank: int = 0


@dataclass(frozen=True, slots=True)
class PlanParams:
    min_rps: float = 0.005  # below this forecast an adapter is left to the request path
    plan_share: float = 0.75  # of each replica's max_adapters, the slots the plan may fill
    copy_share: float = 0.25  # one copy per this share of max_num_seqs of concurrent requests
    scale_down_ticks: int = 3  # plans in a row wanting fewer copies before they drop
    candidates: int = 16  # ring positions priced per adapter (plus previous targets and holders)
    rank_cost: float = 1.0  # per position down the adapter's ring order
    new_load_cost: float = 8.0  # a replica that must load it (0 where it is registered)
    keep_reward: float = 4.0  # a replica the previous plan gave it
    busy_cost: float = 4.0  # × expected running adapters there / max_loras
    target_util: float = 0.7  # desired replicas keep the load under this share


@dataclass(frozen=True, slots=True)
class Plan:
    at: float = 0.0
    targets: dict[str, frozenset[str]] = field(default_factory=dict)  # lora_name → replica urls
    demand: dict[str, float] = field(default_factory=dict)  # lora_name → forecast rate (planned ones)
    desired: dict[str, int] = field(default_factory=dict)  # pool → desired replicas
    fewer: dict[str, int] = field(default_factory=dict)  # lora_name → plans in a row wanting fewer copies
    overflow: int = 0  # copies wanted that found no replica with a planned slot left
    adapters: dict[str, tuple[str, str]] = field(default_factory=dict)  # lora_name → (adapter, version)

    def to_json(self) -> dict[str, object]:
        return {
            "at": self.at,
            "targets": {k: sorted(v) for k, v in self.targets.items()},
            "demand": self.demand,
            "desired": self.desired,
            "fewer": self.fewer,
            "overflow": self.overflow,
            "adapters": {k: list(v) for k, v in self.adapters.items()},
        }

    @classmethod
    def from_json(cls, d: Mapping[str, object]) -> Plan:
        """The inverse of ``to_json`` (ValueError/TypeError/KeyError on a bad document)."""
        targets = d["targets"]
        demand = d.get("demand", {})
        desired = d.get("desired", {})
        fewer = d.get("fewer", {})
        adapters = d.get("adapters", {})
        assert isinstance(targets, dict) and isinstance(demand, dict) and isinstance(desired, dict)
        assert isinstance(fewer, dict) and isinstance(adapters, dict)
        return cls(
            at=float(d.get("at", 0.0)),  # type: ignore[arg-type]
            targets={str(k): frozenset(str(u) for u in v) for k, v in targets.items()},
            demand={str(k): float(v) for k, v in demand.items()},
            desired={str(k): int(v) for k, v in desired.items()},
            fewer={str(k): int(v) for k, v in fewer.items()},
            overflow=int(d.get("overflow", 0)),  # type: ignore[call-overload]
            adapters={str(k): (str(v[0]), str(v[1])) for k, v in adapters.items()},
        )


@dataclass(frozen=True, slots=True)
class PlanAction:
    kind: Literal["load", "unload"]
    url: str
    lora_name: str
    base_model: str


def _healthy(table: ReplicaTable) -> list[ReplicaView]:
    return [v for v in table.views.values() if v.healthy]


def _slots(v: ReplicaView, params: PlanParams) -> int:
    return max(1, math.floor(v.max_adapters * params.plan_share))


def make_plan(
    tables: Mapping[str, ReplicaTable],
    demands: Sequence[Demand],
    previous: Plan | None,
    params: PlanParams,
    now: float,
) -> Plan:
    """The plan for ``demands`` on the replicas of ``tables`` (base model → table)."""
    prev = previous or Plan()
    targets: dict[str, frozenset[str]] = {}
    demand: dict[str, float] = {}
    fewer: dict[str, int] = {}
    desired: dict[str, int] = {}
    adapters: dict[str, tuple[str, str]] = {}
    overflow = 0
    by_base: dict[str, list[Demand]] = {}
    for d in demands:
        by_base.setdefault(d.base_model, []).append(d)
    for base, table in tables.items():
        views = _healthy(table)
        wanted = by_base.get(base, [])
        _desired(views, wanted, params, desired)
        if not views:
            continue
        room = {v.url: v.max_adapters for v in views}  # every slot: hot adapters may fill them
        left = {v.url: _slots(v, params) for v in views}  # planned slots for adapters in demand
        busy = dict.fromkeys(left, 0.0)  # expected running adapters per replica
        cold = dict.fromkeys(left, 0.0)  # ... of them not hot
        mean_w = _mean_time_in_flight(wanted)
        order = sorted(
            (d for d in wanted if d.rate >= params.min_rps or d.min_copies > 0),
            key=lambda d: (-d.min_copies, -d.rate, d.lora_name),
        )
        for d in order:
            conc = max(float(d.inflight), d.rate * mean_w)
            p_run = 1.0 - math.exp(-conc)
            if d.min_copies > 0:
                free = room
            else:  # not into the planned share's last slot, nor the GPU slots kept for hot ones
                free = {
                    u: min(n, room[u]) if _cold_fits(table.views[u], cold[u], p_run) else 0
                    for u, n in left.items()
                }
            if not any(free.values()):
                overflow += max(1, d.min_copies)
                continue
            cap = max(1.0, params.copy_share * views[0].max_num_seqs)
            want = max(1, d.min_copies, math.ceil(conc / cap))
            want = min(want, len(views))
            had = len(prev.targets.get(d.lora_name, ()))
            if want < had:
                streak = prev.fewer.get(d.lora_name, 0) + 1
                if streak < params.scale_down_ticks:
                    fewer[d.lora_name] = streak
                    want = min(had, len(views))
            chosen = _choose(table, d, want, prev.targets.get(d.lora_name, frozenset()), free, busy, params)
            overflow += want - len(chosen)
            if chosen:
                for url in chosen:
                    room[url] -= 1
                    left[url] -= 1
                    busy[url] += p_run / len(chosen)
                    if d.min_copies == 0:
                        cold[url] += p_run / len(chosen)
                targets[d.lora_name] = frozenset(chosen)
                demand[d.lora_name] = round(d.rate, 6)
                adapters[d.lora_name] = (d.adapter_id, d.version)
    return Plan(now, targets, demand, desired, fewer, overflow, adapters)


def _cold_fits(v: ReplicaView, running: float, p_run: float) -> bool:
    """Whether one more cold adapter (running with probability ``p_run``) keeps the cold ones
    expected to run there within ``max_loras - reserved_hot_slots`` (SPEC §15)."""
    if v.reserved_hot_slots <= 0:
        return True
    return running + p_run <= v.max_loras - v.reserved_hot_slots + 1e-9


def _mean_time_in_flight(demands: Sequence[Demand]) -> float:
    """Little's law over the pool: requests in flight / request rate (seconds; 1 when unknown)."""
    rate = sum(d.rate for d in demands)
    inflight = sum(d.inflight for d in demands)
    return inflight / rate if rate > 0 and inflight > 0 else 1.0


def _choose(
    table: ReplicaTable,
    d: Demand,
    want: int,
    before: frozenset[str],
    left: dict[str, int],
    busy: dict[str, float],
    params: PlanParams,
) -> list[str]:
    views = table.views
    pos: dict[str, int] = {}
    for i, url in enumerate(table.walk(d.lora_name)):
        if i >= params.candidates and len(pos) >= want:
            break
        pos[url] = i
    extra = [u for u in (*sorted(before), *table.holders.get(d.lora_name, ())) if u in left and u not in pos]
    for u in extra:
        pos[u] = params.candidates
    chosen: list[str] = []
    for _ in range(want):
        best: tuple[float, int, str] | None = None
        for url, i in pos.items():
            if url in chosen or left.get(url, 0) <= 0:
                continue
            v = views[url]
            r = v.residents.get(d.lora_name)
            cost = params.rank_cost * i + params.busy_cost * busy[url] / max(1, v.max_loras)
            if r is None or r.state not in PRESENT:
                cost += params.new_load_cost
            if url in before:
                cost -= params.keep_reward
            key = (cost, table.order.get(url, 0), url)
            if best is None or key < best:
                best = key
        if best is None:
            break
        chosen.append(best[2])
    return chosen


def _desired(
    views: list[ReplicaView], demands: Sequence[Demand], params: PlanParams, out: dict[str, int]
) -> None:
    """Desired replicas per pool of ``views`` (see the module doc, step 4)."""
    pools: dict[str, list[ReplicaView]] = {}
    for v in views:
        pools.setdefault(v.pool, []).append(v)
    if not pools:
        return
    mean_w = _mean_time_in_flight(demands)
    conc = sum(max(float(d.inflight), d.rate * mean_w) for d in demands)
    running = sum(1.0 - math.exp(-max(float(d.inflight), d.rate * mean_w)) for d in demands)
    total = len(views)
    for pool, vs in pools.items():
        share = len(vs) / total  # the pools of one base model share its demand by size
        seqs = vs[0].max_num_seqs * params.target_util
        loras = vs[0].max_loras * params.target_util
        n = max(1, math.ceil(share * conc / seqs), math.ceil(share * running / loras))
        waiting = sum(v.waiting for v in vs)
        if waiting > 0:
            n = max(n, len(vs) + 1)
        out[pool] = n


def actions(plan: Plan, tables: Mapping[str, ReplicaTable], previous: Plan | None = None) -> list[PlanAction]:
    """Loads that bring residency to ``plan``; unloads of idle copies it moved away (see module doc)."""
    out: list[PlanAction] = []
    for base, table in tables.items():
        views = table.views
        for name, urls in plan.targets.items():
            for url in sorted(urls):
                v = views.get(url)
                if v is None or not v.healthy:
                    continue
                r = v.residents.get(name)
                if r is None:
                    out.append(PlanAction("load", url, name, base))
        if previous is None:
            continue
        for name, urls in previous.targets.items():
            now_at = plan.targets.get(name)
            if now_at is None:
                continue  # no longer planned at all: left to the evictors
            if len(now_at) < len(urls):
                continue  # fewer copies: the extra one stays registered until an evictor needs it
            placed = all(
                (x := views.get(u)) is not None and name in x.residents for u in now_at if u in views
            )
            for url in sorted(urls - now_at):
                v = views.get(url)
                r = v.residents.get(name) if v is not None else None
                if placed and r is not None and r.state == "resident" and r.inflight == 0:
                    out.append(PlanAction("unload", url, name, base))
    return out
