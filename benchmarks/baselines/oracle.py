"""The prefix oracle of issue 28's target: always the replica with the longest cached prefix.

Among the replicas holding the requested adapter (present there: resident or loading), the one
whose prefix cache holds the longest prefix of the prompt *for this adapter* — read from the
engines themselves (the replay's ``prefix_source="engine"``), not from an estimate — ties broken
by fewer requests in flight. An adapter held nowhere goes to the replica with the fewest requests
in flight that can take it (least recently used idle adapter evicted). It ignores load beyond
that tie-break: it is the reference for *prefill computed*, not for latency.
"""

from __future__ import annotations

from typing import ClassVar

from router.placement.evictors import LruIdleEvictor
from router.placement.filters import CanHostFilter, ExcludeFilter, HealthyFilter
from router.placement.framework import PRESENT, PickContext, Picker, SchedulerProfile
from router.placement.scorers import LeastRequestScorer

NAME = "prefix-oracle"


class LongestPrefixPicker(Picker):
    name: ClassVar[str] = "longest-prefix"

    def pick(self, ctx: PickContext, totals: list[float]) -> int:
        prefix = ctx.request.prefix
        held = [i for i, r in ctx.held.items() if r.state in PRESENT]
        if held:
            return max(
                held, key=lambda i: (prefix.get(ctx.replicas[i].url, 0), -ctx.replicas[i].inflight, -i)
            )
        return max(range(len(totals)), key=lambda i: (totals[i], -i))


def prefix_oracle() -> SchedulerProfile:
    return SchedulerProfile(
        NAME,
        [HealthyFilter(), ExcludeFilter(), CanHostFilter()],
        [(LeastRequestScorer(), 1.0)],
        LongestPrefixPicker(),
        LruIdleEvictor(),
    )
