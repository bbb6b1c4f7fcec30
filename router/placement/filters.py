"""Placement filters: each drops replicas that must not serve the request.

| filter      | reads                                    | keeps                                           |
|-------------|------------------------------------------|-------------------------------------------------|
| healthy     | healthy                                  | replicas in rotation                            |
| exclude     | url (request.exclude)                    | replicas not in ``request.exclude`` (failover)  |
| can-host    | residents (state, inflight), max_adapters| holders of the adapter, replicas with a free    |
|             |                                          | registration slot, or with an idle adapter to   |
|             |                                          | evict (never one with requests in flight)       |
"""

from __future__ import annotations

from typing import ClassVar

from router.placement.framework import PRESENT, Filter, PickContext


class HealthyFilter(Filter):
    """Keeps replicas that are in rotation (``healthy``)."""

    name: ClassVar[str] = "healthy"
    reads: ClassVar[frozenset[str]] = frozenset({"healthy"})

    def keep(self, ctx: PickContext) -> list[int] | None:
        reps = ctx.replicas
        keep = [i for i, v in enumerate(reps) if v.healthy]
        return None if len(keep) == len(reps) else keep


class ExcludeFilter(Filter):
    """Drops replicas listed in ``request.exclude`` (the failover retry avoids the one that failed)."""

    name: ClassVar[str] = "exclude"
    reads: ClassVar[frozenset[str]] = frozenset({"url"})

    def keep(self, ctx: PickContext) -> list[int] | None:
        ex = ctx.request.exclude
        if not ex:
            return None
        return [i for i, v in enumerate(ctx.replicas) if v.url not in ex]


class CanHostFilter(Filter):
    """Keeps replicas that can serve the adapter without evicting one with requests in flight.

    Base-model requests (no adapter) keep every replica.
    """

    name: ClassVar[str] = "can-host"
    reads: ClassVar[frozenset[str]] = frozenset({"residents", "max_adapters"})

    def keep(self, ctx: PickContext) -> list[int] | None:
        if ctx.request.lora_name is None:
            return None
        sums = ctx.sums
        keep = [i for i, s in enumerate(sums) if s.takes_new]
        if len(keep) == len(sums):
            return None
        present = PRESENT
        extra = [i for i, t in ctx.held.items() if not sums[i].takes_new and t.state in present]
        return sorted(keep + extra) if extra else keep


FILTERS: dict[str, type[Filter]] = {
    HealthyFilter.name: HealthyFilter,
    ExcludeFilter.name: ExcludeFilter,
    CanHostFilter.name: CanHostFilter,
}
