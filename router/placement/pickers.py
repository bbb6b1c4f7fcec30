"""Placement pickers: choose one replica from the weighted totals.

| picker           | chooses                                                           | state            |
|------------------|-------------------------------------------------------------------|------------------|
| max-score        | highest total; ties → first in the snapshot's order (deterministic)| none             |
| max-score-random | highest total; ties broken uniformly at random (GIE's picker)     | seeded RNG       |
| weighted-random  | at random with probability ∝ total (uniform if all totals are 0)  | seeded RNG       |
| random           | uniformly at random, ignoring scores                              | seeded RNG       |
| round-robin      | the next candidate in turn, ignoring scores                       | counter          |

The RNG and counter live in the picker instance (one per profile instance), never globally.
"""

from __future__ import annotations

import random
from typing import ClassVar

from router.placement.framework import PickContext, Picker

_EPS = 1e-9


class MaxScorePicker(Picker):
    name: ClassVar[str] = "max-score"

    def pick(self, ctx: PickContext, totals: list[float]) -> int:
        floor = max(totals) - _EPS  # ties within _EPS of the top: the first one wins
        for i, t in enumerate(totals):
            if t >= floor:
                return i
        return 0  # unreachable unless totals hold NaN


class MaxScoreRandomTiePicker(Picker):
    name: ClassVar[str] = "max-score-random"

    def __init__(self, seed: int | None = 0) -> None:
        self.rng = random.Random(seed)

    def pick(self, ctx: PickContext, totals: list[float]) -> int:
        top = max(totals)
        ties = [i for i, t in enumerate(totals) if t >= top - _EPS]
        return ties[0] if len(ties) == 1 else self.rng.choice(ties)


class WeightedRandomPicker(Picker):
    name: ClassVar[str] = "weighted-random"

    def __init__(self, seed: int | None = 0) -> None:
        self.rng = random.Random(seed)

    def pick(self, ctx: PickContext, totals: list[float]) -> int:
        total = sum(totals)
        if total <= 0.0:
            return self.rng.randrange(len(totals))
        x = self.rng.random() * total
        acc = 0.0
        for i, t in enumerate(totals):
            acc += t
            if x < acc:
                return i
        return len(totals) - 1


class RandomPicker(Picker):
    name: ClassVar[str] = "random"

    def __init__(self, seed: int | None = 0) -> None:
        self.rng = random.Random(seed)

    def pick(self, ctx: PickContext, totals: list[float]) -> int:
        return self.rng.randrange(len(totals))


class RoundRobinPicker(Picker):
    name: ClassVar[str] = "round-robin"

    def __init__(self) -> None:
        self.counter = 0

    def pick(self, ctx: PickContext, totals: list[float]) -> int:
        i = self.counter % len(totals)
        self.counter += 1
        return i


PICKERS: dict[str, type[Picker]] = {
    cls.name: cls
    for cls in (MaxScorePicker, MaxScoreRandomTiePicker, WeightedRandomPicker, RandomPicker, RoundRobinPicker)
}
