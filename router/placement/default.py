"""The ``default`` profile: the lowest expected cost over a handful of candidates.

One implementation (DESIGN.md example 23), fast by construction: a decision prices only

- the replicas holding the requested adapter (at most ``holders`` of them: when an adapter has
  more copies, a window over them that moves with every decision, its planned copies always in);
- the replicas the placement plan gives it (``PlacementRequest.plan``);
- its first ``choices`` replicas on the table's ring (``table.py``: a stable, per-adapter order
  every gateway process agrees on), walking up to ``4 × choices`` replicas to find one with a
  free registration slot;
- for a base-model request, ``choices`` replicas from a point of the ring that moves with every
  decision (power of d choices), and the replicas holding a prefix of its prompt.

Each candidate is priced with the cost model (``costs.py``) and the cheapest wins (ties: the
table's insertion order). So a decision costs O(holders + choices), whatever the cluster's size;
in a small cluster (replicas ≤ ``choices``) every replica is a candidate and the choice is exact.
The action and the victims follow as in the plugin pipeline: ``hit`` where the adapter is
present, else ``load`` or ``replicate``, the evictor naming the victims when the replica is at
``max_adapters`` (a candidate whose evictor refuses — only kept copies left under
``strict_hot`` — is passed over).
"""

from __future__ import annotations

from collections.abc import Sequence

from router.placement.costs import INFEASIBLE, CostModel, present
from router.placement.evictors import CostAwareEvictor
from router.placement.framework import Evictor, summary
from router.placement.table import ReplicaTable
from router.placement.tiers import tier_of
from router.placement.types import Action, Decision, PlacementRequest, ReplicaView, Residency, Scores


class TableInput:
    """:class:`~router.placement.framework.EvictionInput` over a :class:`ReplicaTable`."""

    __slots__ = ("now", "request", "table", "view")

    def __init__(self, table: ReplicaTable, view: ReplicaView, request: PlacementRequest, now: float) -> None:
        self.table = table
        self.view = view
        self.request = request
        self.now = now

    def idle_lru(self) -> Sequence[Residency]:
        return summary(self.view).idle_lru

    def adapter_inflight(self, name: str) -> int:
        return self.table.inflight(name)

    def healthy_copies(self, name: str) -> int:
        return self.table.healthy_copies(name)


class DefaultPolicy:
    """loraplane's default placement (see the module docstring and README.md)."""

    def __init__(
        self,
        costs: CostModel | None = None,
        evictor: Evictor | None = None,
        *,
        choices: int = 4,
        holders: int = 8,
        pricer: CostAwareEvictor | None = None,
    ) -> None:
        if choices < 1 or holders < 1:
            raise ValueError("choices and holders must be >= 1")
        self.name = "default"
        self.costs = costs or CostModel()
        self.evictor = evictor or CostAwareEvictor()
        # prices evictions (the evictor itself when it is cost-aware)
        self.pricer = pricer or (
            self.evictor if isinstance(self.evictor, CostAwareEvictor) else CostAwareEvictor()
        )
        self.choices = choices
        self.holders = holders
        self._tick = 0
        self._own = ReplicaTable()

    def describe(self) -> dict[str, object]:
        return {
            "name": self.name,
            "choices": self.choices,
            "holders": self.holders,
            "evictor": self.evictor.name,
        }

    def pick(self, request: PlacementRequest, replicas: list[ReplicaView], now: float) -> Decision:
        """The ``Profile`` API over a list of views (a private table is synced first)."""
        self._own.sync(replicas)
        return self.decide(self._own, request, now)

    # ------------------------------------------------------------------ decision

    def decide(self, table: ReplicaTable, request: PlacementRequest, now: float) -> Decision:
        self._tick += 1
        name = request.lora_name
        urls = self._candidates(table, request)
        if not urls:
            return Decision(replica=None, action="none", reason="no healthy replica left")
        views = table.views
        priced: list[tuple[float, int, str]] = []
        for url in urls:
            v = views[url]
            c = self._price(table, v, request, now) if name is not None else self._price_base(v, request)
            if c < INFEASIBLE:
                priced.append((c, table.order[url], url))
        if not priced:
            return Decision(replica=None, action="none", reason="no replica can take the adapter now")
        priced.sort()
        scores = Scores([u for _, _, u in priced], [-c for c, _, _ in priced])
        if name is None:
            return Decision(replica=priced[0][2], action="hit", scores=scores, reason="base model")
        for _, _, url in priced:
            v = views[url]
            r = present(v, name)
            if r is not None:
                reason = "resident" if r.state == "resident" else f"joining {r.state}"
                return Decision(url, "hit", scores=scores, reason=reason, tier=tier_of(v, name))
            need = summary(v).occupied - v.max_adapters + 1
            victims = self.evictor.victims(TableInput(table, v, request, now), need) if need > 0 else ()
            if victims is None:
                continue
            action: Action = "replicate" if self._elsewhere(table, name) else "load"
            reason = f"{action}; evict {','.join(victims)}" if victims else action
            return Decision(url, action, evict=victims, scores=scores, reason=reason, tier="load")
        return Decision(
            replica=None, action="none", scores=scores, reason="every candidate is full of kept copies"
        )

    def _price(self, table: ReplicaTable, v: ReplicaView, req: PlacementRequest, now: float) -> float:
        m = self.costs
        name = req.lora_name
        assert name is not None
        c = m.queue(v) + m.rank_cost(v, req.rank)
        r = present(v, name)
        if r is not None:
            c += m.tier_cost(v, r) + m.deferral(v, r.inflight > 0)
            c -= req.prefix.get(v.url, 0) * m.prefill_s_per_token
        else:
            c += m.load_cost(req) + m.deferral(v, False)
            c += m.eviction(TableInput(table, v, req, now), self.pricer)
        planned = req.plan.get(name)
        if planned is not None and v.url not in planned:
            c += m.off_plan_s
        return c

    def _price_base(self, v: ReplicaView, req: PlacementRequest) -> float:
        m = self.costs
        return m.queue(v) - req.prefix.get(v.url, 0) * m.prefill_s_per_token

    @staticmethod
    def _elsewhere(table: ReplicaTable, name: str) -> bool:
        views = table.views
        for url in table.holders.get(name, ()):
            v = views[url]
            r = v.residents.get(name)
            if v.healthy and r is not None and r.state == "resident":
                return True
        return False

    # ------------------------------------------------------------------ candidates

    def _candidates(self, table: ReplicaTable, req: PlacementRequest) -> list[str]:
        views = table.views
        ex = req.exclude
        out: dict[str, None] = {}

        def ok(url: str) -> bool:
            v = views.get(url)
            return v is not None and v.healthy and url not in ex

        name = req.lora_name
        if name is None:
            key = f"base#{self._tick % 4096}"
            for url in req.prefix:
                if ok(url):
                    out[url] = None
        else:
            key = name
            planned = req.plan.get(name, ())
            for url in planned:
                if ok(url):
                    out[url] = None
            every = table.holder_list(name)
            n_held = len(every)
            if n_held <= self.holders:
                for url in every:
                    if ok(url):
                        out[url] = None
            else:  # a window of at most ``holders`` usable copies, moving with every decision
                start, taken = self._tick % n_held, 0
                for i in range(n_held):
                    url = every[(start + i) % n_held]
                    if ok(url):
                        out[url] = None
                        taken += 1
                        if taken >= self.holders:
                            break
        n = 0
        free = False
        limit = 4 * self.choices
        for i, url in enumerate(table.walk(key)):
            if i >= limit or (n >= self.choices and (free or name is None)):
                break
            if not ok(url):
                continue
            if n < self.choices:
                out[url] = None
                n += 1
                free = free or summary(views[url]).free
            elif summary(views[url]).free:
                out[url] = None
                free = True
        return list(out)
