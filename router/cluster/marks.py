"""This process's side of the in-flight marks (``RedisCluster``): counts, the marks written to
Redis with their tokens, and which of them may be released.

A mark is written to Redis when this process starts using an adapter on a replica (count
0 → 1) and nothing of ours is there yet; it is released ``linger_s`` after the count went back
to 0 (so back-to-back requests skip the round trip), by a conditional delete on its token, so
a release racing a newer mark of ours never deletes the newer one.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator

Key = tuple[str, str]  # (replica url, lora_name)


class MarkBook:
    def __init__(self, counts: dict[Key, int]) -> None:
        self.counts = counts  # requests in flight per key (shared with the in-process fallback)
        self._published: dict[Key, str] = {}  # marks written to Redis → their token
        self._idle_since: dict[Key, float] = {}  # count reached 0 at (wall)
        self._tokens = itertools.count(1)

    def take(self, key: Key) -> str | None:
        """Count one more use; the token to write when no mark of ours is live (else None)."""
        self._idle_since.pop(key, None)
        self.counts[key] = self.counts.get(key, 0) + 1
        return None if key in self._published else str(next(self._tokens))

    def written(self, key: Key, token: str) -> None:
        self._published[key] = token

    def give(self, key: Key, now: float) -> None:
        """One use ended; the mark starts lingering when none is left."""
        left = self.counts.get(key, 0) - 1
        if left > 0:
            self.counts[key] = left
            return
        self.counts.pop(key, None)
        if key in self._published:
            self._idle_since[key] = now

    def due(self, now: float, linger_s: float, *, force: bool = False) -> dict[str, list[str]]:
        """Marks to release now, per replica url: [field, token, field, token, …] (forgotten here)."""
        out: dict[str, list[str]] = {}
        for key, since in list(self._idle_since.items()):
            if (force or now - since >= linger_s) and self.counts.get(key, 0) == 0:
                del self._idle_since[key]
                token = self._published.pop(key, None)
                if token is not None:
                    out.setdefault(key[0], []).extend((key[1], token))
        return out

    def live(self) -> Iterator[tuple[Key, str]]:
        """Every mark written to Redis and not released (to re-assert or to say goodbye)."""
        return iter(list(self._published.items()))

    def clear(self) -> None:
        self._published.clear()
        self._idle_since.clear()
