"""Evictors: which idle adapters to unload from the chosen replica when it is at ``max_adapters``.

| evictor            | unloads                                                                   |
|--------------------|---------------------------------------------------------------------------|
| lru-idle           | the least recently used idle residents (``framework.Evictor``)             |
| lru-idle-keep-hot  | the same, passing over idle copies of adapters still in demand elsewhere  |
"""

from __future__ import annotations

from itertools import repeat
from operator import attrgetter
from typing import ClassVar

from router.placement.framework import Evictor, PickContext
from router.placement.types import Resident

_RESIDENTS = attrgetter("residents")
_INFLIGHT = attrgetter("inflight")


class HotCopyEvictor(Evictor):
    """LRU idle eviction that keeps copies of adapters still in demand (replication hysteresis).

    An idle resident whose adapter has, summed over all replicas, in-flight ≥ ``low_water`` ×
    max_num_seqs (a copy of a hot adapter that is momentarily idle here) is passed over while
    enough colder idle adapters exist. At most ``scan`` idle candidates are examined.
    """

    name: ClassVar[str] = "lru-idle-keep-hot"

    def __init__(self, low_water: float = 0.05, scan: int = 8) -> None:
        self.low_water = low_water
        self.scan = scan

    def victims(self, ctx: PickContext, index: int, need: int) -> tuple[str, ...] | None:
        view = ctx.replicas[index]
        idle = ctx.sums[index].idle_lru
        if len(idle) < need:
            return None
        cap = view.max_num_seqs if view.max_num_seqs > 0 else 1
        chosen: list[str] = []
        maps: list[dict[str, Resident]] | None = None  # every replica's residents, built once
        for r in idle[: self.scan]:
            if len(chosen) == need:
                break
            name = r.lora_name
            if maps is None:
                maps = list(map(_RESIDENTS, ctx.all_replicas))
            # Σ in-flight of this adapter over every replica holding it (C-level iteration:
            # residents.get per replica, drop the misses, add the in-flight counts).
            demand = sum(map(_INFLIGHT, filter(None, map(dict.get, maps, repeat(name)))))
            if not demand / cap >= self.low_water:
                chosen.append(name)
        if len(chosen) < need:  # not enough cold ones: fall back to plain LRU order
            rest = [r.lora_name for r in idle if r.lora_name not in chosen]
            chosen.extend(rest[: need - len(chosen)])
        return tuple(chosen)


EVICTORS: dict[str, type[Evictor]] = {Evictor.name: Evictor, HotCopyEvictor.name: HotCopyEvictor}
