"""Minimal raw-ASGI request/response helpers (the hot path avoids framework overhead)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

import orjson

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

JSON_CT = (b"content-type", b"application/json")


class Request:
    __slots__ = ("_body", "headers", "method", "path", "path_params", "receive", "scope", "send")

    def __init__(self, scope: Scope, receive: Receive, send: Send) -> None:
        self.scope = scope
        self.receive = receive
        self.send = send
        self.method: str = scope["method"]
        self.path: str = scope["path"]
        self.headers: dict[bytes, bytes] = dict(scope["headers"])
        self.path_params: dict[str, str] = {}
        self._body: bytes | None = None

    def header(self, name: bytes) -> str:
        return self.headers.get(name, b"").decode("latin-1")

    async def body(self) -> bytes:
        if self._body is None:
            chunks: list[bytes] = []
            for _ in range(1_000_000):
                msg = await self.receive()
                if msg["type"] == "http.disconnect":
                    break
                chunks.append(msg.get("body", b""))
                if not msg.get("more_body", False):
                    break
            self._body = b"".join(chunks)
        return self._body


async def send_response(
    send: Send,
    status: int,
    body: bytes,
    headers: list[tuple[bytes, bytes]] | tuple[tuple[bytes, bytes], ...] = (),
) -> None:
    hdrs = [*headers, (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": hdrs})
    await send({"type": "http.response.body", "body": body})


async def send_json(send: Send, status: int, obj: Any, headers: tuple[tuple[bytes, bytes], ...] = ()) -> None:
    await send_response(send, status, orjson.dumps(obj), (JSON_CT, *headers))


def error_obj(message: str, type_: str, code: int, param: str | None = None) -> dict[str, Any]:
    """vLLM ≥0.10.1 error envelope."""
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


async def send_error(send: Send, code: int, message: str, type_: str, param: str | None = None) -> None:
    await send_json(send, code, error_obj(message, type_, code, param))


def validation_message(errors: list[dict[str, Any] | str]) -> str:
    """FastAPI RequestValidationError rendered the way vLLM's handler does."""
    n = len(errors)
    head = f"{n} validation error{'s' if n != 1 else ''}:"
    return head + "".join("\n  " + (e if isinstance(e, str) else repr(e)) for e in errors)
