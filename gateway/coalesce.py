"""One socket write per answer: uvicorn's HTTP protocol with its writes coalesced.

uvicorn writes an answer's status line and headers when the app sends ``http.response.start``
and the body when it sends ``http.response.body``: two ``write`` calls, and on an idle socket
uvloop turns each into its own system call and TCP segment (the client is woken twice). On the
gateway's hot path that second loopback write cost as much CPU as any other step of a request.

:class:`CoalescingTransport` sits between uvicorn's protocol and the socket's transport: a write
ending in a blank line (an answer's head) is held until the next write (then both go out in
one call, at once) or until the end of the current event-loop step (a ``call_soon``), whichever
comes first; any other write goes out at once as before; closing writes what is held first. A
complete answer sent in one step (``send_bytes``: start, then the whole body) is one write; a
stream's head goes out with its first chunk when that is already there (the router reads it
before answering), else one loop step later; a stream's later chunks are not held. Nothing is
held across an ``await`` that waits for I/O.
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol


class CoalescingTransport:
    """The parts of ``asyncio.Transport`` uvicorn's HTTP protocol uses, with writes coalesced."""

    __slots__ = ("_held", "_loop", "_transport")

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._held: bytes | None = None

    def write(self, data: bytes | bytearray | memoryview) -> None:
        held = self._held
        if held is not None:
            self._held = None
            self._transport.write(held + data)
        elif data[-4:] == b"\r\n\r\n":  # an answer's head (or a chunked body's end)
            self._held = bytes(data)
            self._loop.call_soon(self.flush)
        elif data:  # a body or a stream's chunk with nothing held: at once, as before
            self._transport.write(data)

    def writelines(self, chunks: Any) -> None:
        self.write(b"".join(chunks))

    def flush(self) -> None:
        held, self._held = self._held, None
        if held is not None and not self._transport.is_closing():
            self._transport.write(held)

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def abort(self) -> None:
        self._held = None
        self._transport.abort()

    def is_closing(self) -> bool:
        return self._transport.is_closing()

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self._transport.get_extra_info(name, default)

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        self.flush()
        self._transport.set_protocol(protocol)

    def pause_reading(self) -> None:
        self._transport.pause_reading()

    def resume_reading(self) -> None:
        self._transport.resume_reading()

    def get_write_buffer_size(self) -> int:
        return self._transport.get_write_buffer_size() + (len(self._held) if self._held else 0)


#: Scope key of the disconnect hook (:class:`CoalescingHttpToolsProtocol`): present (None) when the
#: server calls ``scope[DISCONNECT_HOOK]()`` if the client's connection drops before the answer is
#: complete; the app puts a callable there while it wants to hear of it. Once the connection has
#: dropped, the key holds :data:`GONE` (a later callable would never be called).
DISCONNECT_HOOK = "loraplane.on_disconnect"
GONE = "gone"


class CoalescingHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol writing through a :class:`CoalescingTransport`, with a
    disconnect hook in each request's scope (:data:`DISCONNECT_HOOK`): the gateway hears of a
    client gone without a task per request waiting on ``receive()`` for ``http.disconnect``."""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)  # flow control and addresses keep the real transport
        self.transport = CoalescingTransport(transport, self.loop)  # type: ignore[assignment]

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self.scope[DISCONNECT_HOOK] = None  # type: ignore[literal-required]

    def connection_lost(self, exc: Exception | None) -> None:
        cycle = self.cycle
        super().connection_lost(exc)
        if cycle is not None and cycle.disconnected:  # the answer was not complete
            scope: Any = cycle.scope
            hook = scope.get(DISCONNECT_HOOK)
            scope[DISCONNECT_HOOK] = GONE
            if callable(hook):
                hook()
