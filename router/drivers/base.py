"""The engine driver interface: everything engine-specific behind one small protocol.

A driver knows how to talk to one kind of replica (vLLM, SGLang, Ray Serve LLM, TensorRT-LLM):
health, the adapters a replica has registered, its metrics, loading and unloading an adapter
(and classifying why a load failed), how a request names an adapter, and what an answer to a
request means. It declares what its engine does itself as :class:`Capabilities` (data); the
router reads those, never the engine's name. Placement and forwarding only see the results
below.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from router.capabilities import Capabilities

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
        """Every failed load is retried once on another replica: even a rejection can be the
        replica's own (a lower ``--max-lora-rank``, runtime loading off, a wrong API key, a sick
        engine). Adapters that can never load are refused at upload (SPEC §3), and a hash
        mismatch — the one failure that is the same everywhere — is not retried (the loader)."""
        return not self.ok


@dataclass(frozen=True, slots=True)
class UnloadResult:
    ok: bool  # True also when the adapter was already gone
    already_gone: bool = False
    message: str = ""


# How a replica's answer to an inference request is handled: passed to the client as it is
# (``ok``: 2xx, and 4xx about the request itself), retried once on another replica (``retry``:
# 5xx, the replica is in trouble), or the adapter reloaded first (``adapter_missing``: the
# replica no longer knows the adapter — it restarted).
AnswerKind = Literal["ok", "retry", "adapter_missing"]


class Retryable(Exception):
    """Failed before the first byte in a way another replica may not (connection refused, 5xx)."""

    def __init__(
        self,
        message: str,
        *,
        replica_down: bool = False,
        adapter_missing: bool = False,
        timeout: bool = False,
        answered: bool = False,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.replica_down = replica_down
        self.adapter_missing = adapter_missing
        self.timeout = timeout
        self.answered = answered  # the replica answered (5xx, unknown model): about this model


class UpstreamBody(Protocol):
    def iter_any(self) -> AsyncIterator[bytes]:
        """The body as it arrives: all the bytes available at each step."""
        ...


class UpstreamResponse(Protocol):
    """A replica's answer, headers read (``router.drivers.http1.Response``, or aiohttp's). Reading
    raises ``OSError`` (the connection failed) or ``TimeoutError``."""

    @property
    def status(self) -> int: ...

    @property
    def headers(self) -> Mapping[str, str]: ...

    @property
    def content(self) -> UpstreamBody: ...

    @property
    def closed(self) -> bool: ...

    async def read(self) -> bytes: ...

    def release(self) -> object:
        """Done with the answer (read to its end): the connection may serve the next request."""
        ...

    def close(self) -> None:
        """Abandon the answer: the connection is dropped (the replica sees the disconnect)."""
        ...


class EngineDriver(Protocol):
    """One engine's HTTP API. Implementations translate library errors into these results."""

    name: str
    capabilities: Capabilities

    async def health(self, url: str, timeout: float) -> bool: ...

    async def list_adapters(self, url: str, timeout: float) -> ModelsInfo: ...

    async def metrics_text(self, url: str, timeout: float) -> str: ...

    def parse_metrics(self, text: str) -> MetricsSample: ...

    async def load(
        self,
        url: str,
        lora_name: str,
        lora_path: str,
        timeout: float,
        *,
        pinned: bool = False,
        int_id: int = 0,
    ) -> LoadResult:
        """Make ``lora_name`` (files at ``lora_path``, as the replica reads them; for a
        ``lazy_by_name`` engine: published under that name) servable on ``url``. ``pinned``: a hot
        adapter, pinned in a GPU slot where the engine can (``capabilities.pinning``); ``int_id``:
        the version's stable integer id (``capabilities.needs_int_id``)."""
        ...

    async def unload(self, url: str, lora_name: str, timeout: float) -> UnloadResult: ...

    async def send(
        self, url: str, endpoint: str, body: bytes, request_id: str, *, stream: bool
    ) -> UpstreamResponse:
        """POST an inference request (``endpoint``: ``chat/completions`` | ``completions``) and
        return the response with its headers read. Non-streaming: the whole answer is bounded
        by the request timeout; streaming: each read by the idle timeout (no bound on a stream
        that keeps sending). Raises ``Retryable`` (no answer: refused, reset) or
        ``router.contract.UpstreamTimeout``."""
        ...

    def classify_answer(self, status: int, body: bytes, *, adapter: bool) -> AnswerKind:
        """What to do with an answer of ``status`` to a request (``adapter``: for an adapter).
        ``body``: the answer's body when it is not a 200 (an error's few bytes), else ``b""``."""
        ...

    def request_fields(self, lora_name: str | None, int_id: int, served_model: str) -> dict[str, Any]:
        """The fields a request for ``lora_name`` (None → the base model; ``int_id``: the version's
        stable integer id) sets in the body: ``model`` always, and whatever else the engine reads
        (TensorRT-LLM's ``lora_request``). ``model`` is also what the answer must name."""
        ...

    def auth_headers(self) -> dict[str, str]: ...

    async def aclose(self) -> None:
        """Close the connections of the inference path (the router's stop)."""
        ...
