"""Offline lower bound on adapter loads for a trace, and one-cache references.

A cluster of ``R`` replicas each keeping ``max_adapters`` adapters registered holds at most
``R × max_adapters`` distinct adapters at any time, and a request for an adapter held nowhere
costs a load. Whatever placement, replication and eviction a policy uses, its loads are
therefore at least the misses of the best possible single cache of ``R × max_adapters`` items
serving the same sequence of adapter names:

* **compulsory** loads — the first request of each adapter (no policy avoids them);
* **Belady's MIN** — on a miss with the cache full, evict the item whose next request is
  farthest in the future (never requested again first). It is optimal for a single cache with
  demand loading (Belady 1966; Mattson et al. 1970), and loading ahead of demand cannot do
  better, so ``loads ≥ belady_min ≥ compulsory`` for every policy that serves the requests in
  the trace's order (the routing benchmark prints a note when a profile refused a request and
  served it later, out of order).

MIN needs the future; the references below do not, and show what an online policy can hope
for on the same single cache: LRU, and LFU with the full request history (counts survive
eviction; ties by recency). Base-model requests (adapter ``None``) are left out.
"""

from __future__ import annotations

import heapq
from collections import OrderedDict
from collections.abc import Sequence


def compulsory(names: Sequence[str | None]) -> int:
    """Distinct adapters requested: loads no policy can avoid."""
    return len({n for n in names if n is not None})


def belady_min(names: Sequence[str | None], capacity: int) -> int:
    """Misses of Belady's MIN on one cache of ``capacity`` items (the offline optimum)."""
    if capacity < 1:
        raise ValueError("capacity must be >= 1")
    seq = [n for n in names if n is not None]
    never = len(seq)  # "next request" of an item never requested again
    nxt = [never] * len(seq)
    seen: dict[str, int] = {}
    for i in range(len(seq) - 1, -1, -1):
        nxt[i] = seen.get(seq[i], never)
        seen[seq[i]] = i
    cached: dict[str, int] = {}  # item → index of its next request
    heap: list[tuple[int, str]] = []  # (−next request, item); stale entries skipped on pop
    misses = 0
    for i, name in enumerate(seq):
        if name not in cached:
            misses += 1
            if len(cached) >= capacity:
                while True:
                    neg, victim = heapq.heappop(heap)
                    if cached.get(victim) == -neg:
                        del cached[victim]
                        break
        cached[name] = nxt[i]
        heapq.heappush(heap, (-nxt[i], name))
    return misses


def lru_misses(names: Sequence[str | None], capacity: int) -> int:
    """Misses of LRU on one cache of ``capacity`` items (an online reference, not a bound)."""
    cache: OrderedDict[str, None] = OrderedDict()
    misses = 0
    for name in names:
        if name is None:
            continue
        if name in cache:
            cache.move_to_end(name)
            continue
        misses += 1
        if len(cache) >= capacity:
            cache.popitem(last=False)
        cache[name] = None
    return misses


def lfu_misses(names: Sequence[str | None], capacity: int) -> int:
    """Misses of LFU with the whole request history on one cache of ``capacity`` items (evict
    the cached item asked for least often so far; ties: least recently used). An online
    reference: it knows the past of every adapter, evicted or not, but not the future."""
    count: dict[str, int] = {}
    last: dict[str, int] = {}
    heap: list[tuple[int, int, str]] = []  # (count, last request, item); stale entries skipped
    cached: set[str] = set()
    misses = 0
    for i, name in enumerate(names):
        if name is None:
            continue
        count[name] = count.get(name, 0) + 1
        last[name] = i
        if name not in cached:
            misses += 1
            if len(cached) >= capacity:
                while True:
                    c, t, victim = heapq.heappop(heap)
                    if victim in cached and count[victim] == c and last[victim] == t:
                        cached.discard(victim)
                        break
            cached.add(name)
        heapq.heappush(heap, (count[name], i, name))
    return misses


def bounds(names: Sequence[str | None], capacity: int) -> dict[str, int]:
    """Everything above for one trace (``capacity`` = replicas × max_adapters)."""
    return {
        "capacity": capacity,
        "compulsory": compulsory(names),
        "belady_min": belady_min(names, capacity),
        "lru_one_cache": lru_misses(names, capacity),
        "lfu_one_cache": lfu_misses(names, capacity),
    }
