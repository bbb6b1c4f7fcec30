"""The replicas of one base model as the default policy and the placement plan read them.

A ``ReplicaTable`` holds the latest ``ReplicaView`` of each replica and two indexes kept up to
date per changed view (``put``), so that a decision never visits every replica:

- **holders**: lora_name → the replicas whose view lists it (any state), in insertion order;
- **a consistent-hash ring** (Karger et al.) of the healthy replicas, ``vnodes`` points each:
  ``walk(key)`` yields the replicas in the stable order of the ring from ``key``'s point. Every
  gateway process computes the same order (the hash is BLAKE2b, not Python's salted ``hash``),
  a replica joining or leaving moves only the keys next to its points (minimal reshuffling),
  and an adapter's first replicas on its walk are where it goes when nothing else decides —
  rendezvous-style stability for the placement plan and for cold adapters.

The router's planner keeps one table per base model, told only of the replicas that changed;
``DefaultPolicy.pick`` over a plain list of views syncs a private table first (tests,
benchmarks).
"""

from __future__ import annotations

import hashlib
from bisect import bisect_left
from collections.abc import Iterator

from router.placement.types import ReplicaView

_MASK = (1 << 64) - 1
_HASHES: dict[str, int] = {}


def stable_hash(key: str) -> int:
    """A 64-bit hash of ``key``, the same in every process (memoised, bounded)."""
    h = _HASHES.get(key)
    if h is None:
        if len(_HASHES) > 200_000:
            _HASHES.clear()
        h = _HASHES[key] = int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "big")
    return h


def _point(url: str, i: int) -> int:
    return stable_hash(f"{url}#{i}")


def _add(sums: dict[str, int], name: str, delta: int) -> None:
    """``sums[name] += delta``, the entry dropped at zero (the sums stay as small as the table)."""
    n = sums.get(name, 0) + delta
    if n:
        sums[name] = n
    else:
        sums.pop(name, None)


class ReplicaTable:
    """Views by url, holders by adapter, and the ring of healthy replicas (see module doc)."""

    __slots__ = (
        "_copies", "_inflight", "_lists", "_members", "_points", "_ring", "holders", "order", "version",
        "views", "vnodes",
    )  # fmt: skip

    def __init__(self, vnodes: int = 32) -> None:
        self.vnodes = vnodes
        self.views: dict[str, ReplicaView] = {}
        self.order: dict[str, int] = {}  # url → position of first insertion (stable tie-break)
        self.holders: dict[str, dict[str, None]] = {}
        self._lists: dict[str, list[str]] = {}  # holders as a list (indexable), rebuilt on change
        self._inflight: dict[str, int] = {}  # lora_name → requests in flight, every replica
        self._copies: dict[str, int] = {}  # lora_name → healthy replicas holding it (not failed)
        self._members: set[str] = set()  # healthy replicas
        self._ring: list[tuple[int, str]] | None = []
        self._points: list[int] = []
        self.version = 0  # bumped when the ring's membership changes

    def __len__(self) -> int:
        return len(self.views)

    def put(self, view: ReplicaView) -> None:
        """Add or replace the view of ``view.url``."""
        url = view.url
        old = self.views.get(url)
        if old is view:
            return
        self.views[url] = view
        if url not in self.order:
            self.order[url] = len(self.order)
        if old is not None:
            self._count(old, -1)
        self._count(view, 1)
        before = old.residents if old is not None else {}
        after = view.residents
        if before is not after:
            for name in before.keys() - after.keys():
                self._unhold(name, url)
            for name in after.keys() - before.keys():
                self.holders.setdefault(name, {})[url] = None
                self._lists.pop(name, None)
        was = old is not None and old.healthy
        if view.healthy != was:
            if view.healthy:
                self._ring_add(url)
            else:
                self._ring_drop(url)

    def remove(self, url: str) -> None:
        old = self.views.pop(url, None)
        if old is None:
            return
        self._count(old, -1)
        for name in old.residents:
            self._unhold(name, url)
        if old.healthy:
            self._ring_drop(url)

    def sync(self, views: list[ReplicaView]) -> None:
        """Make the table hold exactly ``views`` (identity checks: unchanged views cost little)."""
        table = self.views
        for v in views:
            if table.get(v.url) is not v:
                self.put(v)
        if len(table) != len(views):
            keep = {v.url for v in views}
            for url in [u for u in table if u not in keep]:
                self.remove(url)

    def _unhold(self, name: str, url: str) -> None:
        held = self.holders.get(name)
        if held is not None:
            held.pop(url, None)
            self._lists.pop(name, None)
            if not held:
                del self.holders[name]

    def _count(self, view: ReplicaView, sign: int) -> None:
        """Add (``sign`` 1) or take back (-1) ``view``'s share of the per-adapter sums."""
        for name, r in view.residents.items():
            if r.inflight:
                _add(self._inflight, name, sign * r.inflight)
            if view.healthy and r.state != "failed":
                _add(self._copies, name, sign)

    # ------------------------------------------------------------------ per adapter

    def holder_list(self, name: str) -> list[str]:
        """The replicas whose view lists ``name``, in insertion order (cached until it changes)."""
        lst = self._lists.get(name)
        if lst is None:
            held = self.holders.get(name)
            if held is None:
                return []  # not cached: an adapter nobody holds leaves nothing behind
            lst = self._lists[name] = list(held)
        return lst

    def inflight(self, name: str) -> int:
        """Requests in flight for ``name`` over every replica of the table (O(1))."""
        return self._inflight.get(name, 0)

    def healthy_copies(self, name: str) -> int:
        """Healthy replicas holding ``name`` in any state but failed (O(1))."""
        return self._copies.get(name, 0)

    # ------------------------------------------------------------------ the ring

    def _ring_add(self, url: str) -> None:
        self._members.add(url)
        self._ring = None
        self.version += 1

    def _ring_drop(self, url: str) -> None:
        self._members.discard(url)
        self._ring = None
        self.version += 1

    def _built(self) -> list[tuple[int, str]]:
        """The ring, rebuilt after a membership change (rare: health flips, replicas joining)."""
        ring = self._ring
        if ring is None:
            ring = self._ring = sorted(
                (_point(url, i), url) for url in self._members for i in range(self.vnodes)
            )
            self._points = [p for p, _ in ring]
        return ring

    def walk(self, key: str) -> Iterator[str]:
        """Distinct healthy replica urls in ring order from ``key``'s point."""
        ring = self._built()
        n = len(ring)
        if not n:
            return
        start = bisect_left(self._points, stable_hash(key))
        seen: set[str] = set()
        want = len(self._members)
        for i in range(n):
            url = ring[(start + i) % n][1]
            if url not in seen:
                seen.add(url)
                yield url
                if len(seen) >= want:
                    return

    def healthy(self) -> int:
        return len(self._members)
