"""The default policy's cost model: the seconds a request is expected to lose on a replica.

One currency for everything the default policy weighs (``router/placement/README.md`` has the
table): where the adapter comes from there (``tiers.py``: GPU, the CPU tier, disk, or a cold
load), what a load would destroy (the cheapest idle victim's expected reload cost, as the
cost-aware evictor prices it), waiting behind a full running set (``max_loras``), the replica's
load, the prompt prefix it has cached for this adapter (prefill saved), serving an adapter off
the replicas the placement plan gave it, and the padding of a low-rank adapter on a pool with a
high ``max_lora_rank``. The policy picks the lowest cost; none of it does I/O.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any

from router.placement.evictors import CostAwareEvictor
from router.placement.framework import EvictionInput, summary
from router.placement.tiers import PRESENT_STATES, tiers
from router.placement.types import PlacementRequest, ReplicaView, Residency

INFEASIBLE = math.inf


@dataclass(frozen=True, slots=True)
class CostModel:
    """Seconds lost per request; every field is a ``LORAPLANE_PLACEMENT_PARAMS`` key of ``default``."""

    load_s: float = 0.15  # a cold load: staging, sha256, HTTP, the engine's add_lora (fixed part)
    load_bytes_per_s: float = 2e9  # + size / this: reading the weights from disk
    cpu_s: float = 0.002  # an adapter in the engine's host cache copied into a GPU slot
    pcie_bytes_per_s: float = 16e9  # + padded size / this (host → GPU)
    disk_s: float = 0.03  # a registered adapter the engine re-reads from disk (+ size / load rate)
    defer_s: float = 1.0  # waiting behind a full running set, per adapter beyond max_loras
    queue_s: float = 0.02  # replica load f = (in flight + waiting) / max_num_seqs costs queue_s·f/(1−f)
    prefill_s_per_token: float = 0.0001  # prefill saved per prompt token cached there
    off_plan_s: float = 0.3  # serving a planned adapter on a replica the plan did not give it
    rank_pad_s: float = 0.002  # per doubling of the pool's max_lora_rank over the adapter's rank
    evict_weight: float = 1.0  # × the cheapest idle victim's expected reload cost

    @classmethod
    def from_params(cls, params: dict[str, Any]) -> tuple[CostModel, dict[str, Any]]:
        """Split ``params`` into a CostModel and what is left (ValueError on a bad value)."""
        names = {f.name for f in fields(cls)}
        mine = {k: params.pop(k) for k in list(params) if k in names}
        for k, v in mine.items():
            if not isinstance(v, int | float) or isinstance(v, bool) or not v >= 0 or not math.isfinite(v):
                raise ValueError(f"default profile: {k} must be a finite number >= 0, got {v!r}")
        model = cls(**{k: float(v) for k, v in mine.items()})
        if model.load_bytes_per_s <= 0 or model.pcie_bytes_per_s <= 0:
            raise ValueError("default profile: load_bytes_per_s and pcie_bytes_per_s must be > 0")
        return model, params

    # ------------------------------------------------------------------ parts

    def queue(self, view: ReplicaView) -> float:
        f = summary(view).load
        f = 0.95 if f > 0.95 else f
        return self.queue_s * f / (1.0 - f)

    def tier_cost(self, view: ReplicaView, r: Residency) -> float:
        """A request for ``r`` (present on ``view``) served there: the tier's cost."""
        if r.state != "resident":
            return 0.5 * (self.load_s + r.size_bytes / self.load_bytes_per_s)  # join a load midway
        tier = tiers(view).get(r.lora_name, "gpu")
        if tier == "gpu":
            return 0.0
        if tier == "cpu":
            return self.cpu_s + padded(r.size_bytes, r.rank, view.max_lora_rank) / self.pcie_bytes_per_s
        return self.disk_s + r.size_bytes / self.load_bytes_per_s

    def load_cost(self, req: PlacementRequest) -> float:
        return self.load_s + req.size_bytes / self.load_bytes_per_s

    def deferral(self, view: ReplicaView, running_here: bool) -> float:
        """Waiting behind ``max_loras`` other adapters (vLLM defers, never rejects)."""
        if running_here:
            return 0.0
        k = summary(view).running
        return self.defer_s * (1 + k - view.max_loras) if k >= view.max_loras else 0.0

    def rank_cost(self, view: ReplicaView, rank: int) -> float:
        """INFEASIBLE when the pool's max_lora_rank is below the adapter's rank (vLLM refuses
        the load); else the padding, per doubling."""
        m = view.max_lora_rank
        if m <= 0 or rank <= 0:
            return 0.0
        if rank > m:
            return INFEASIBLE
        return self.rank_pad_s * math.log2(m / rank)

    def eviction(self, inp: EvictionInput, evictor: CostAwareEvictor) -> float:
        """What making room on ``inp.view`` destroys (0 with a free slot, INFEASIBLE with
        nothing idle), memoised per view, second and plan."""
        view = inp.view
        s = summary(view)
        if s.free:
            return 0.0
        if not s.takes_new:
            return INFEASIBLE
        req = inp.request
        second = math.floor(inp.now) if math.isfinite(inp.now) else inp.now
        memo = view.derived.get("eviction")
        if memo is not None and memo[0] == second and memo[1] is req.plan and memo[2] is req.hot_targets:
            return memo[3]  # type: ignore[no-any-return]
        value = self.evict_weight * evictor.cheapest(inp)
        view.derived["eviction"] = (second, req.plan, req.hot_targets, value)
        return value


def padded(size_bytes: int, rank: int, max_rank: int) -> float:
    """The bytes a GPU slot copies for an adapter of ``rank`` on an engine padding to ``max_rank``."""
    if rank <= 0 or max_rank <= rank:
        return float(size_bytes)
    return size_bytes * (max_rank / rank)


def present(view: ReplicaView, name: str) -> Residency | None:
    r = view.residents.get(name)
    return r if r is not None and r.state in PRESENT_STATES else None
