"""A Dynamo-style LoRA placement controller, as published, as a placement ``Profile``.

NVIDIA Dynamo's LoRA placement (ai-dynamo/dynamo PRs #8177–#8192 and the "Optimal LoRA
Placement & Routing" proposal they implement): the router hosts a controller that every tick
re-estimates each adapter's demand, decides how many replicas should serve it and which, and
routes requests to that set; servers load lazily on the first request ("routing changes can
precede actual loads"). Parts, and what this module keeps of each:

1. **Demand**: arrivals counted per adapter in buckets of ``tick_s``; an exponential moving
   average of the bucketed rates predicts the next bucket (``ema`` = weight of the newest).
2. **Replica counts** proportional to demand: ``R_a = ceil(share_a × replicas × factor)``,
   clamped to [1, replicas], ``share_a`` = the adapter's share of the predicted rate. Up at
   once; down only after ``down_ticks`` ticks in a row wanting fewer (hysteresis). A slot
   budget: at most ``slot_share`` × ``max_adapters`` planned adapters per server; adapters are
   placed most-demanded first and the ones that find no budget are left unplanned.
3. **Which replicas** (stable under churn): rendezvous / highest-random-weight hashing ranks the
   servers per adapter by ``H(adapter | server)``; each copy goes to the server of least cost
   ``α·rank + γ·new_load − β·keep_reward`` (rank in the HRW order; new_load 1 where the adapter
   is not registered; keep_reward 1 where the previous plan had it) with budget left.
   *Simplified*: Dynamo solves this as a min-cost flow over all adapters at once; here a greedy
   assignment, adapter by adapter in demand order, copy by copy (the same cost terms; with
   per-server budgets that rarely bind the two agree).
4. **Routing**: among the adapter's planned servers (an unplanned adapter: its HRW top server),
   Dynamo's KV-aware cost — prompt blocks still to prefill there (prefix-cache overlap
   subtracted) plus the blocks already active there (KV usage) — lowest wins. If none of them can
   take it (full with nothing idle), the next servers in HRW order.
5. **Eviction** when a server is at its adapter limit: the least recently used idle adapter not
   planned on that server, then planned ones (Dynamo's churn bounds: never drop a planned copy
   while another victim exists). *Simplified*: no per-window load/unload budget or lease timers;
   no proactive loads (Dynamo realises the plan lazily too).
"""

from __future__ import annotations

import hashlib
import math
from collections import defaultdict
from dataclasses import dataclass, field
from functools import lru_cache
from typing import ClassVar

from router.placement.evictors import LruIdleEvictor
from router.placement.filters import CanHostFilter, ExcludeFilter, HealthyFilter
from router.placement.framework import PRESENT, EvictionInput, Evictor, PickContext, Picker, SchedulerProfile
from router.placement.types import ReplicaView

NAME = "dynamo"


def hrw_order(key: str, servers: list[str]) -> list[str]:
    """Servers by descending rendezvous weight H(key | server) (BLAKE2b: the same everywhere)."""
    return list(_hrw(key, tuple(servers)))


@lru_cache(maxsize=65_536)
def _hrw(key: str, servers: tuple[str, ...]) -> tuple[str, ...]:
    def weight(s: str) -> int:
        return int.from_bytes(hashlib.blake2b(f"{key}|{s}".encode(), digest_size=8).digest(), "big")

    return tuple(sorted(servers, key=lambda s: (-weight(s), s)))


@dataclass(slots=True)
class DynamoParams:
    tick_s: float = 5.0  # controller period = demand bucket width
    ema: float = 0.5  # weight of the newest bucket in the moving average
    factor: float = 1.0  # copies per (share of the demand × servers)
    down_ticks: int = 3  # ticks in a row wanting fewer copies before they drop
    slot_share: float = 0.75  # of max_adapters, the planned adapters per server (slot budget)
    alpha: float = 1.0  # cost per HRW rank position
    gamma: float = 2.0  # cost of a server that must load it
    beta: float = 3.0  # reward of a server the previous plan gave it
    min_rate: float = 1e-3  # adapters predicted below this are dropped from the controller
    kv_blocks: float = 25_000.0  # KV-cache blocks per server (400k tokens / 16): active-load term
    block_tokens: int = 16


@dataclass(slots=True)
class DynamoController:
    """The controller's state and its pure-ish tick (``plan``)."""

    params: DynamoParams = field(default_factory=DynamoParams)
    counts: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    predicted: dict[str, float] = field(default_factory=dict)
    copies: dict[str, int] = field(default_factory=dict)
    fewer: dict[str, int] = field(default_factory=dict)
    targets: dict[str, tuple[str, ...]] = field(default_factory=dict)
    next_tick: float | None = None
    ticks: int = 0
    moves: int = 0  # planned copies placed on a server the previous plan did not give the adapter

    def observe(self, name: str) -> None:
        self.counts[name] += 1

    def maybe_tick(self, now: float, views: list[ReplicaView]) -> None:
        if self.next_tick is None:
            self.next_tick = now + self.params.tick_s
        while now >= self.next_tick:  # one tick per elapsed bucket (empty buckets decay the EMA)
            self.tick(views)
            self.next_tick += self.params.tick_s

    def tick(self, views: list[ReplicaView]) -> None:
        p = self.params
        rates = {k: n / p.tick_s for k, n in self.counts.items()}
        self.counts = defaultdict(int)
        pred: dict[str, float] = {}
        for name in self.predicted.keys() | rates.keys():
            old = self.predicted.get(name)
            x = rates.get(name, 0.0)
            v = x if old is None else p.ema * x + (1 - p.ema) * old
            if v >= p.min_rate:
                pred[name] = v
        self.predicted = pred
        self.ticks += 1
        servers = sorted(v.url for v in views if v.healthy)
        if not servers:
            self.targets = {}
            return
        total = sum(pred.values()) or 1.0
        budget = {v.url: max(1, math.floor(v.max_adapters * p.slot_share)) for v in views if v.healthy}
        holds = {v.url: v.residents for v in views}
        targets: dict[str, tuple[str, ...]] = {}
        for name in sorted(pred, key=lambda k: (-pred[k], k)):
            want = min(len(servers), max(1, math.ceil(pred[name] / total * len(servers) * p.factor)))
            had = self.copies.get(name, 0)
            if want < had:
                streak = self.fewer.get(name, 0) + 1
                if streak < p.down_ticks:
                    self.fewer[name] = streak
                    want = had
                else:
                    self.fewer.pop(name, None)
            else:
                self.fewer.pop(name, None)
            before = set(self.targets.get(name, ()))
            order = hrw_order(name, servers)
            chosen: list[str] = []
            for _ in range(want):
                best: tuple[float, int, str] | None = None
                for rank, s in enumerate(order):
                    if s in chosen or budget[s] <= 0:
                        continue
                    r = holds[s].get(name)
                    cost = p.alpha * rank + (0.0 if r is not None and r.state in PRESENT else p.gamma)
                    cost -= p.beta if s in before else 0.0
                    if best is None or (cost, rank) < best[:2]:
                        best = (cost, rank, s)
                if best is None:
                    break
                chosen.append(best[2])
                budget[best[2]] -= 1
            if chosen:
                self.moves += len(set(chosen) - before)
                targets[name] = tuple(chosen)
                self.copies[name] = len(chosen)
        for name in list(self.copies):
            if name not in targets:
                del self.copies[name]
        self.targets = targets

    def servers_for(self, name: str, servers: list[str]) -> list[str]:
        """The adapter's planned servers, then the rest in its HRW order (fallbacks)."""
        planned = self.targets.get(name, ())
        return [*planned, *(s for s in hrw_order(name, servers) if s not in planned)]


class DynamoPicker(Picker):
    """Routes within the controller's replica set by Dynamo's KV-aware cost (module doc, 4)."""

    name: ClassVar[str] = "dynamo-kv"

    def __init__(self, controller: DynamoController) -> None:
        self.controller = controller

    def pick(self, ctx: PickContext, totals: list[float]) -> int:
        c = self.controller
        req = ctx.request
        c.maybe_tick(ctx.now, ctx.all_replicas)
        p = c.params
        index = {v.url: i for i, v in enumerate(ctx.replicas)}

        def cost(i: int) -> tuple[float, int, str]:
            v = ctx.replicas[i]
            new = max(0, req.prompt_tokens - req.prefix.get(v.url, 0)) / p.block_tokens
            return (new + v.kv_cache_usage * p.kv_blocks + v.waiting * 32, v.inflight, v.url)

        name = req.lora_name
        if name is None:
            return min(range(len(ctx.replicas)), key=cost)
        c.observe(name)
        order = c.servers_for(name, sorted(v.url for v in ctx.all_replicas))
        planned = [index[u] for u in order[: max(1, len(c.targets.get(name, ())))] if u in index]
        if planned:
            return min(planned, key=cost)
        for u in order:  # deterministic fallback: next in the adapter's HRW order
            if u in index:
                return index[u]
        return 0


class DynamoEvictor(Evictor):
    """LRU idle, adapters not planned on the chosen server first (module doc, 5)."""

    name: ClassVar[str] = "dynamo-lru"

    def __init__(self, controller: DynamoController) -> None:
        self.controller = controller
        self._lru = LruIdleEvictor()

    def victims(self, inp: EvictionInput, need: int) -> tuple[str, ...] | None:
        idle = inp.idle_lru()
        if len(idle) < need:
            return None
        url = inp.view.url
        targets = self.controller.targets
        off = [r.lora_name for r in idle if url not in targets.get(r.lora_name, ())]
        on = [r.lora_name for r in idle if url in targets.get(r.lora_name, ())]
        return tuple((off + on)[:need])


def dynamo(**params: float) -> SchedulerProfile:
    """A fresh Dynamo-style profile (``DynamoParams`` fields as keyword arguments)."""
    ctl = DynamoController(DynamoParams(**params))  # type: ignore[arg-type]
    prof = SchedulerProfile(
        NAME,
        [HealthyFilter(), ExcludeFilter(), CanHostFilter()],
        [],
        DynamoPicker(ctl),
        DynamoEvictor(ctl),
    )
    return prof
