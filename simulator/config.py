"""``SimConfig``: every flag of one simulated replica, and the mutable fault-injection state."""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

from simulator.behaviours import BehaviourSet, parse_behaviours
from simulator.engine import ALLOWED_LORA_RANKS, TimingParams
from simulator.flavour_options import SIM_ENGINES, FlavourOptions

VLLM_VERSION = "0.33.0"


@dataclass
class FaultState:
    """Fault injection (all off by default). Changed by flags or ``POST /_sim/faults``."""

    fail_loads: int = 0  # fail the next N load calls
    fail_load_status: int = 500  # 404 (not found) or 500 (engine failure)
    slow_load_s: float = 0.0  # extra seconds added to every load call
    dead: bool = False  # /health 503; generation and load calls fail with 500
    die_after_tokens: int | None = None  # close streaming connections abruptly after K tokens
    die_streams: int | None = None  # ... for the next N streams only (None = every stream)
    stall_s: float = 0.0  # pause every request for S seconds ...
    stall_after_tokens: int = 1  # ... after this many tokens
    exit_after_requests: int | None = None  # the process exits after N generation requests
    behaviours: BehaviourSet = field(default_factory=BehaviourSet)  # simulated behaviours per adapter

    _FIELDS = (
        "fail_loads",
        "fail_load_status",
        "slow_load_s",
        "dead",
        "die_after_tokens",
        "die_streams",
        "stall_s",
        "stall_after_tokens",
        "exit_after_requests",
        "behaviours",
    )

    def as_dict(self) -> dict[str, Any]:
        out = {k: getattr(self, k) for k in self._FIELDS}
        out["behaviours"] = self.behaviours.as_json()
        return out

    def update(self, changes: dict[str, Any]) -> None:
        """Apply ``changes`` all or nothing; ValueError (``BehaviourError`` for ``behaviours``) on an
        unknown field or a bad value, and then nothing has changed."""
        trial = copy.copy(self)
        trial._apply(changes)
        for key in self._FIELDS:
            setattr(self, key, getattr(trial, key))

    def _apply(self, changes: dict[str, Any]) -> None:
        for key, value in changes.items():
            if key not in self._FIELDS:
                raise ValueError(f"unknown fault field {key!r}")
            if key == "behaviours":  # the whole set is replaced; null or {} clears it
                value = parse_behaviours(value)
            elif key == "dead":
                if not isinstance(value, bool):
                    raise ValueError("dead must be a boolean")
            elif key in ("slow_load_s", "stall_s"):
                if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
                    raise ValueError(f"{key} must be a number >= 0")
                value = float(value)
            elif key in ("die_after_tokens", "die_streams", "exit_after_requests"):
                if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
                    raise ValueError(f"{key} must be null or an integer >= 0")
            else:
                if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                    raise ValueError(f"{key} must be an integer >= 0")
                if key == "fail_load_status" and value not in (404, 500):
                    raise ValueError("fail_load_status must be 404 or 500")
            setattr(self, key, value)


@dataclass
class SimConfig:
    """One simulated vLLM replica. ``create_app(SimConfig(...))`` builds it in process."""

    model: str = "demo-base"  # served base name (``--served-model-name``)
    model_root: str | None = None  # ``root`` of the base card (vLLM: the --model value); None = model
    max_model_len: int = 8192
    timing: TimingParams = field(default_factory=TimingParams.zero)
    max_lora_rank: int = 64
    api_key: str | None = None
    allow_runtime_lora: bool = True
    lora_modules: list[tuple[str, str]] = field(default_factory=list)  # static (name, path)
    enable_server_load_tracking: bool = False
    enable_fault_control: bool = False
    faults: FaultState = field(default_factory=FaultState)
    default_max_tokens: int = 16
    seed: int = 0  # mixed into every generation (a different "model")
    wrap_worker_errors: bool = False  # vLLM's multiproc-executor wording of load failures
    version: str = VLLM_VERSION
    # which engine's HTTP API this replica speaks (simulator/README.md "Engine flavours")
    engine: str = "vllm"
    flavour: FlavourOptions = field(default_factory=FlavourOptions)

    def __post_init__(self) -> None:
        if self.engine not in SIM_ENGINES:
            raise ValueError(f"engine must be one of {', '.join(SIM_ENGINES)}, got {self.engine!r}")
        if self.max_lora_rank not in ALLOWED_LORA_RANKS:
            raise ValueError(
                f"max_lora_rank must be one of {list(ALLOWED_LORA_RANKS)}, got {self.max_lora_rank}"
            )
        if self.default_max_tokens < 1 or self.max_model_len < 1:
            raise ValueError("default_max_tokens and max_model_len must be >= 1")
