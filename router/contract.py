"""CONTRACT between the gateway and the router (the gateway imports this; the router implements it).

The gateway parses, authenticates, resolves the model string to a ``VersionInfo`` (or None
for the bare base model) and admits the request; then it calls::

    result = await router.forward(ForwardRequest(...))

The router picks a replica, makes sure the version is staged (sha256-verified) and loaded
there (singleflight across gateway processes), sends the body with ``model`` set to the
version's ``lora_name`` (or the base model's served name), retries once on another replica
on a load failure or an error before the first byte, and returns a ``ForwardResult``.

It raises ``RouterError`` subclasses (below) — never library exceptions.

Stream handling (router side): every SSE event / JSON body has ``model`` rewritten to
``client_model``; the router checks that the replica answered for the ``lora_name`` it asked
(a mismatch is an error + audit event); when ``want_usage`` is set the router always asks the
replica for usage (``stream_options.include_usage``) and, if the client did not ask for it
(``client_wants_usage`` False), strips the usage chunk from what the client sees. Usage seen is
reported in ``ForwardResult.usage`` once the body / stream has ended (for streams: after
the iterator is exhausted or closed). A replica dying mid-stream yields a final
``data: {"error": {...}}`` event and ``data: [DONE]``, never a silent truncation. Closing the
iterator early (client disconnect) cancels the upstream request.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from registry.replicas import ReplicaDirectory
from registry.snapshot import RoutingSnapshot, VersionInfo


@dataclass(slots=True)
class ForwardRequest:
    request_id: str
    tenant_id: str
    base_model: str
    version: VersionInfo | None  # None → the base model itself
    endpoint: Literal["chat/completions", "completions"]
    body: dict[str, Any]  # the client's body (the router copies it before changing ``model``)
    client_model: str  # what the client sent, echoed in every answer
    stream: bool
    client_wants_usage: bool = False  # stream_options.include_usage from the client
    want_usage: bool = True  # ask the replica for usage (to settle token limits)
    pinned: bool = False  # the client named the version (``BASE:ADAPTER@vN``): never a fallback


@dataclass(slots=True)
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0


@dataclass(slots=True)
class ForwardResult:
    status: int  # upstream HTTP status (200 normally; a 4xx from the replica is passed through)
    headers: dict[str, str]  # content-type etc. to pass to the client
    replica: str  # replica url that answered
    cold_load: bool  # True when this request waited for a load
    queue_s: float = 0.0  # time spent waiting for placement / load
    body: bytes | None = None  # non-streaming answer (already rewritten)
    stream: AsyncIterator[bytes] | None = None  # SSE bytes (already rewritten), for stream=True
    usage: Usage | None = None  # filled when known (non-stream: at once; stream: at its end)
    # streams: set when the stream ended with an error event instead of the replica's [DONE]
    # (``upstream_error`` | ``upstream_timeout`` | ``wrong_adapter``), or the engine sent its own
    # in-band error event (``engine_error``); known once it has ended
    stream_error: str | None = None
    # set when the adapter's ``on_load_failure`` policy served something else (SPEC §15):
    # ``previous_version`` | ``base_model``, and the version that answered (``base`` for the model)
    fallback: str | None = None
    served_version: str | None = None


class RouterError(Exception):
    """Base of router errors. ``code`` is the gateway-facing error code."""

    status = 503
    code = "no_capacity"
    retry_after: int | None = 1

    def __init__(self, message: str, *, retry_after: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        if retry_after is not None:
            self.retry_after = retry_after


class NoCapacity(RouterError):
    """No healthy replica for this base model, or every candidate is saturated."""

    status = 503
    code = "no_capacity"


class AdapterLoadFailed(RouterError):
    """Staging, verification or the engine load failed (after the retry on another replica)."""

    status = 503
    code = "adapter_load_failed"


class UpstreamTimeout(RouterError):
    status = 504
    code = "upstream_timeout"
    retry_after = None


class UpstreamError(RouterError):
    """The replica failed before the first byte, also on the retry."""

    status = 502
    code = "upstream_error"


class RouterAPI(Protocol):
    """What the gateway uses of the router (``router.Router`` implements it; mypy checks it)."""

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    async def forward(self, req: ForwardRequest) -> ForwardResult: ...

    def update_snapshot(self, snapshot: RoutingSnapshot) -> None:
        """A new registry snapshot (every revision)."""
        ...

    def healthy_count(self, base_model: str | None = None) -> int:
        """Replicas in rotation (of ``base_model``, or of every pool)."""
        ...

    def is_resident(self, lora_name: str) -> bool:
        """Whether a healthy replica holds ``lora_name`` (a request for it needs no load)."""
        ...

    @property
    def directory(self) -> ReplicaDirectory:
        """Replica records and prewarm for the admin API in the same process."""
        ...
