"""Value types of the engine model: ``TimingParams`` (with defaults) and the events it emits."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Literal

EventKind = Literal["first_token", "token", "finished"]

#: vLLM's allowed ``--max-lora-rank`` values.
ALLOWED_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


@dataclass(frozen=True, slots=True)
class TimingParams:
    """Timing and capacity of one simulated replica. Defaults: an 8B model on one H100.

    ``max_cpu_loras`` None means "= max_loras" (vLLM's default).
    """

    load_fixed_s: float = 0.030  # per adapter read from disk (open, parse, allocate)
    load_bytes_per_s: float = 2e9  # disk → host → GPU bandwidth for adapter weights
    cpu_cache_reload_s: float = 0.002  # CPU cache → GPU slot copy
    prefill_s_per_token: float = 0.0001  # ~10k prompt tokens/s
    decode_base_s: float = 0.012  # one forward step with a tiny batch
    decode_per_seq_s: float = 0.00015  # extra step time per running sequence
    max_num_seqs: int = 256
    max_loras: int = 4
    max_cpu_loras: int | None = None
    kv_cache_tokens: int = 400_000  # ~60 GB of KV cache at 128 KiB/token (Llama-3-8B)
    time_scale: float = 1.0  # multiply every duration (0.1 = ten times faster)

    def __post_init__(self) -> None:
        if self.max_loras < 1:
            raise ValueError("max_loras must be >= 1")
        if self.max_num_seqs < 1:
            raise ValueError("max_num_seqs must be >= 1")
        if self.max_cpu_loras is not None and self.max_cpu_loras < self.max_loras:
            raise ValueError(f"max_cpu_loras ({self.max_cpu_loras}) must be >= max_loras ({self.max_loras}).")
        if self.time_scale < 0 or self.load_bytes_per_s <= 0:
            raise ValueError("time_scale must be >= 0 and load_bytes_per_s > 0")

    @property
    def cpu_loras(self) -> int:
        return self.max_cpu_loras if self.max_cpu_loras is not None else self.max_loras

    @classmethod
    def zero(cls, **overrides: object) -> TimingParams:
        """Every duration zero (tests); capacities stay as given."""
        base = cls(
            load_fixed_s=0.0,
            load_bytes_per_s=math.inf,
            cpu_cache_reload_s=0.0,
            prefill_s_per_token=0.0,
            decode_base_s=0.0,
            decode_per_seq_s=0.0,
        )
        return replace(base, **overrides)  # type: ignore[arg-type]

    @property
    def is_zero(self) -> bool:
        return self.time_scale == 0 or (
            self.load_fixed_s == 0
            and math.isinf(self.load_bytes_per_s)
            and self.cpu_cache_reload_s == 0
            and self.prefill_s_per_token == 0
            and self.decode_base_s == 0
            and self.decode_per_seq_s == 0
        )

    def load_cost(self, size_bytes: int) -> float:
        """Seconds to read an adapter of ``size_bytes`` from disk (scaled)."""
        return (self.load_fixed_s + size_bytes / self.load_bytes_per_s) * self.time_scale


@dataclass(slots=True)
class RequestTimes:
    """Timestamps of one request (for latency metrics)."""

    arrival: float
    scheduled_at: float | None
    first_token_at: float | None
    generated: int


@dataclass(slots=True)
class EngineEvent:
    kind: EventKind
    req_id: str
    time: float
    index: int  # tokens generated so far (1 for the first token)
    times: RequestTimes | None = None  # set on "finished" events


@dataclass(slots=True)
class AdapterLoad:
    lora_id: int
    ready_at: float
    duration: float
