"""``stream_out``: chunks passed through, and ``finalize`` run exactly once on every exit path —
normal end, client disconnect, a send that fails, the request cancelled from outside."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, MutableMapping
from typing import Any

import pytest

from gateway.asgi import stream_out


class Client:
    """The ASGI side: records what was sent; ``disconnect_after`` body chunks, it goes away."""

    def __init__(self, disconnect_after: int | None = None, send_error: Exception | None = None) -> None:
        self.sent: list[MutableMapping[str, Any]] = []
        self.disconnect_after = disconnect_after
        self.send_error = send_error
        self.gone = asyncio.Event()

    async def send(self, msg: MutableMapping[str, Any]) -> None:
        if self.send_error is not None and msg["type"] == "http.response.body":
            raise self.send_error
        self.sent.append(msg)
        bodies = sum(1 for m in self.sent if m["type"] == "http.response.body")
        if self.disconnect_after is not None and bodies >= self.disconnect_after:
            self.gone.set()

    async def receive(self) -> MutableMapping[str, Any]:
        await self.gone.wait()
        return {"type": "http.disconnect"}


class Upstream:
    def __init__(self, n: int, delay: float = 0.0) -> None:
        self.n = n
        self.delay = delay
        self.closed = False

    async def chunks(self) -> AsyncIterator[bytes]:
        try:
            for i in range(self.n):
                if self.delay:
                    await asyncio.sleep(self.delay)
                yield f"data: {i}\n\n".encode()
        finally:
            self.closed = True


async def run(client: Client, up: Upstream) -> tuple[list[bool], int]:
    finals: list[bool] = []
    seen = 0

    def on_chunk() -> None:
        nonlocal seen
        seen += 1

    async def finalize(disconnected: bool) -> None:
        await asyncio.sleep(0.01)  # finalize awaits (settlement): must complete
        finals.append(disconnected)

    await stream_out(client.receive, client.send, 200, [], up.chunks(), on_chunk, finalize)
    return finals, seen


async def test_all_chunks_then_finalize_once() -> None:
    client, up = Client(), Upstream(5)
    finals, seen = await run(client, up)
    assert finals == [False] and seen == 5 and up.closed
    bodies = [m["body"] for m in client.sent if m["type"] == "http.response.body"]
    assert bodies[:5] == [f"data: {i}\n\n".encode() for i in range(5)] and bodies[5] == b""
    assert client.sent[-1]["more_body"] is False
    await asyncio.sleep(0.01)
    assert not [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]  # watcher gone


async def test_client_disconnect_stops_the_upstream_and_returns_normally() -> None:
    client, up = Client(disconnect_after=2), Upstream(1000, delay=0.01)
    task = asyncio.current_task()
    assert task is not None
    finals, seen = await asyncio.wait_for(run(client, up), 5)
    assert finals == [True] and seen < 10 and up.closed
    assert task.cancelling() == 0  # the pump's cancellation was taken back
    await asyncio.sleep(0)  # and no stray cancellation arrives later


async def test_send_failure_counts_as_disconnect() -> None:
    client, up = Client(send_error=OSError("reset")), Upstream(5)
    finals, _ = await run(client, up)
    assert finals == [True]  # (closing the upstream is finalize's job, as in the gateway)


async def test_cancel_from_outside_propagates_after_finalize() -> None:
    client, up = Client(), Upstream(1000, delay=0.01)
    finals: list[bool] = []

    async def finalize(disconnected: bool) -> None:
        await asyncio.sleep(0.05)
        finals.append(disconnected)

    task = asyncio.create_task(
        stream_out(client.receive, client.send, 200, [], up.chunks(), lambda: None, finalize)
    )
    await asyncio.sleep(0.05)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert finals == [False] and up.closed  # finalize ran to the end despite the cancellation


async def test_disconnect_and_outside_cancel_together_still_cancel() -> None:
    client, up = Client(), Upstream(1000, delay=0.01)
    finals: list[bool] = []

    async def finalize(disconnected: bool) -> None:
        finals.append(disconnected)

    task = asyncio.create_task(
        stream_out(client.receive, client.send, 200, [], up.chunks(), lambda: None, finalize)
    )
    await asyncio.sleep(0.03)
    client.gone.set()  # the watcher will cancel the pump ...
    task.cancel()  # ... and so does the server
    with pytest.raises(asyncio.CancelledError):
        await task
    assert len(finals) == 1


async def test_watcher_failure_is_raised_after_finalize() -> None:
    up = Upstream(1000, delay=0.01)
    finals: list[bool] = []

    async def receive() -> MutableMapping[str, Any]:
        await asyncio.sleep(0.02)
        raise RuntimeError("receive broke")

    async def send(msg: MutableMapping[str, Any]) -> None:
        return None

    async def finalize(disconnected: bool) -> None:
        finals.append(disconnected)

    with pytest.raises(RuntimeError, match="receive broke"):
        await stream_out(receive, send, 200, [], up.chunks(), lambda: None, finalize)
    assert finals == [False] and up.closed
