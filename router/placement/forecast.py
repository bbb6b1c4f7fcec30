"""Forecast of each adapter version's request rate from the cluster's counts.

Every gateway process counts the requests it routes per lora_name and adds them to the
cluster's demand board (``router.cluster.board``) in time buckets; the placement controller
reads the buckets closed since its last tick and calls ``observe(counts, seconds, now)``.

The forecast is an exponential moving average of the measured rates that rises faster than it
falls (``alpha_up`` on a rise, ``alpha_down`` on a fall): a burst or a ramp is followed within a
tick or two, while a lull does not drop an adapter's copies at once — the plan's own hysteresis
comes on top. An adapter whose forecast falls below ``floor`` is forgotten (bounded memory).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass(slots=True)
class Forecaster:
    alpha_up: float = 0.7
    alpha_down: float = 0.2
    floor: float = 1e-4
    rates: dict[str, float] = field(default_factory=dict)  # lora_name → forecast requests/s
    measured: dict[str, float] = field(default_factory=dict)  # lora_name → last measured rate

    def __post_init__(self) -> None:
        if not (0 < self.alpha_down <= 1 and 0 < self.alpha_up <= 1):
            raise ValueError("alpha_up and alpha_down must be in (0, 1]")

    def observe(self, counts: Mapping[str, int], seconds: float) -> dict[str, float]:
        """Fold in ``counts`` (requests per lora_name over ``seconds``); returns the forecast."""
        if seconds <= 0:
            return self.rates
        measured = {name: n / seconds for name, n in counts.items() if n > 0}
        out: dict[str, float] = {}
        for name in self.rates.keys() | measured.keys():
            x = measured.get(name, 0.0)
            old = self.rates.get(name)
            if old is None:
                new = x
            else:
                a = self.alpha_up if x > old else self.alpha_down
                new = a * x + (1 - a) * old
            if new >= self.floor:
                out[name] = new
        self.rates = out
        self.measured = measured
        return out
