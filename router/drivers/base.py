"""The engine driver interface: everything engine-specific behind one small protocol.

A driver knows how to talk to one kind of replica (vLLM first; SGLang, TensorRT-LLM or Ray
Serve LLM later): health, the adapters a replica has registered, its metrics, loading and
unloading an adapter (and classifying why a load failed), and how a request names an
adapter. Placement and forwarding only see the results below.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Protocol

LoadFailure = Literal["not_found", "rejected", "timeout", "replica_down", "conflict", "other"]


@dataclass(frozen=True, slots=True)
class ModelsInfo:
    """What ``/v1/models`` says: served base names and registered adapters (name → path)."""

    base_names: tuple[str, ...]
    adapters: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class MetricsSample:
    running: int = 0
    waiting: int = 0
    waiting_by_reason: dict[str, int] = field(default_factory=dict)
    kv_cache_usage: float = 0.0
    lora_running: tuple[str, ...] = ()
    lora_waiting: tuple[str, ...] = ()
    max_lora: int | None = None


@dataclass(frozen=True, slots=True)
class LoadResult:
    ok: bool
    failure: LoadFailure | None = None
    status: int | None = None
    message: str = ""

    @property
    def retry_elsewhere(self) -> bool:
        """A rejected adapter fails everywhere; other failures may succeed on another replica."""
        return not self.ok and self.failure != "rejected"


@dataclass(frozen=True, slots=True)
class UnloadResult:
    ok: bool  # True also when the adapter was already gone
    already_gone: bool = False
    message: str = ""


class EngineDriver(Protocol):
    """One engine's HTTP API. Implementations translate library errors into these results."""

    name: str

    async def health(self, url: str, timeout: float) -> bool: ...

    async def list_adapters(self, url: str, timeout: float) -> ModelsInfo: ...

    async def metrics_text(self, url: str, timeout: float) -> str: ...

    def parse_metrics(self, text: str) -> MetricsSample: ...

    async def load(self, url: str, lora_name: str, lora_path: str, timeout: float) -> LoadResult: ...

    async def unload(self, url: str, lora_name: str, timeout: float) -> UnloadResult: ...

    def request_model(self, lora_name: str | None, served_model: str) -> str:
        """The ``model`` value of a request for ``lora_name`` (None → the base model)."""
        ...

    def auth_headers(self) -> dict[str, str]: ...
