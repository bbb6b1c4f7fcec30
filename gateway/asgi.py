"""Minimal ASGI plumbing for the gateway's hot path (no framework per request).

``read_body`` (size-capped), ``send_bytes`` (one whole answer), and ``stream_out`` — the SSE pass-
through that watches for the client's disconnect while streaming and, whatever happens
(normal end, disconnect, upstream failure, cancellation), runs ``finalize`` shielded from
cancellation, so concurrency slots and token settlement never leak.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from typing import Any

import anyio

from gateway.errors import GatewayError

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
RawHeaders = list[tuple[bytes, bytes]]

JSON = b"application/json"


def header_map(scope: Scope) -> dict[bytes, bytes]:
    """The request headers the gateway reads (lower-case names; last one wins)."""
    return dict(scope["headers"])


async def read_body(receive: Receive, headers: dict[bytes, bytes], max_bytes: int) -> bytes:
    """The whole request body; 413 beyond ``max_bytes``; 400 on a client disconnect."""
    cl = headers.get(b"content-length")
    if cl is not None:
        try:
            if int(cl) > max_bytes:
                raise GatewayError(413, "payload_too_large", f"request body larger than {max_bytes} bytes")
        except ValueError:
            raise GatewayError(400, "invalid_request", "invalid Content-Length header") from None
    chunks: list[bytes] = []
    size = 0
    while True:
        msg = await receive()
        if msg["type"] == "http.disconnect":
            raise GatewayError(400, "invalid_request", "client disconnected while sending the body")
        body = msg.get("body", b"")
        if body:
            size += len(body)
            if size > max_bytes:
                raise GatewayError(413, "payload_too_large", f"request body larger than {max_bytes} bytes")
            chunks.append(body)
        if not msg.get("more_body", False):
            break
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


async def send_bytes(
    send: Send, status: int, body: bytes, headers: RawHeaders, content_type: bytes = JSON
) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", content_type),
                (b"content-length", str(len(body)).encode()),
                *headers,
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


async def stream_out(
    receive: Receive,
    send: Send,
    status: int,
    headers: RawHeaders,
    chunks: AsyncIterator[bytes],
    on_chunk: Callable[[], None],
    finalize: Callable[[bool], Awaitable[None]],
    *,
    end_marker: bytes | None = None,
    before_end: Callable[[], Awaitable[None]] | None = None,
) -> None:
    """Pass ``chunks`` through as they arrive; ``finalize(disconnected)`` runs on every exit path.

    ``before_end`` is awaited before the chunk that ends with ``end_marker`` (the stream's last
    event, e.g. ``data: [DONE]``) is sent: what must happen before the client can see the end.

    The chunks are pumped in the calling task while a watcher task waits for the client's
    disconnect and then cancels the pump (that one cancellation is taken back, so a cancellation
    of the request from outside still propagates). Plain asyncio: an anyio task group per stream
    cost more CPU than the rest of the pass-through.
    """
    task = asyncio.current_task()
    assert task is not None
    disconnected = False
    stopped = False  # the watcher cancelled the pump
    failure: Exception | None = None

    async def watch() -> None:
        nonlocal disconnected, stopped, failure
        try:
            while True:
                msg = await receive()
                if msg["type"] == "http.disconnect":
                    disconnected = True
                    break
        except Exception as e:  # reported by the pump's side, like a task group would
            failure = e
        stopped = True
        task.cancel()

    watcher = asyncio.get_running_loop().create_task(watch())
    try:
        try:
            await send({"type": "http.response.start", "status": status, "headers": headers})
            async for chunk in chunks:
                on_chunk()
                if before_end is not None and end_marker is not None and chunk.endswith(end_marker):
                    hook, before_end = before_end, None
                    await hook()
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        except OSError:
            disconnected = True
        except asyncio.CancelledError:
            # ours (disconnect) unless the request was also cancelled from outside
            if not stopped or task.uncancel() > 0:
                raise
        finally:
            watcher.cancel()
        if failure is not None:
            raise failure
    finally:
        with anyio.CancelScope(shield=True):
            await finalize(disconnected)
