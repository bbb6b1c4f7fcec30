"""Forwarding to a replica: pooled keep-alive aiohttp connections, byte-level model rewrite,
streaming passed through chunk by chunk, usage accounting, wrong-adapter detection.

The hot path does not re-parse answers: the replica's ``"model":"<lora_name>"`` is found and
replaced by the client's model string with a byte search (vLLM writes compact JSON, and that
byte sequence cannot occur inside a JSON string, where quotes are escaped). Only the small
usage chunk of a stream is parsed, and an engine's in-band error event (``data: {"error": …}``
on an HTTP 200, vLLM's way of failing after the stream started): it is passed on in the
gateway's error shape (code ``engine_error``) and recorded in ``ForwardResult.stream_error``, so
the request counts as failed (access log, metrics, canary analysis), not as a success.
"""

from __future__ import annotations

import logging
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

import aiohttp
import orjson

from router.contract import ForwardResult, UpstreamError, UpstreamTimeout, Usage
from router.drivers.base import Retryable, UpstreamResponse

log = logging.getLogger("loraplane.router.forward")

MODEL_KEY = b'"model":"'
DONE = b"data: [DONE]"
ERROR_EVENT = b'data: {"error"'  # an engine's in-band error event (vLLM's, compact or not)
ENGINE_ERROR = "engine_error"  # ``ForwardResult.stream_error`` after one
_USAGE_RE = re.compile(rb'"(prompt_tokens|completion_tokens|total_tokens)":(\d+)')


class WrongAdapter(UpstreamError):
    """The replica answered for another model than the one asked for (audit ``adapter.wrong_adapter``)."""

    code = "upstream_error"


@dataclass(slots=True)
class Rewriter:
    """Rewrites ``model`` and checks it was the one asked for."""

    expected: bytes  # the name the replica must answer with
    replacement: bytes  # "model":"<client model>" (JSON-encoded value)

    def rewrite(self, payload: bytes) -> tuple[bytes, bytes | None]:
        """(rewritten, None) or (payload, wrong_name) when the replica answered for another model."""
        i = payload.find(MODEL_KEY)
        if i < 0:
            return self._slow(payload) if b'"model"' in payload else (payload, None)
        start = i + len(MODEL_KEY)
        end = payload.find(b'"', start)
        if end < 0:
            return payload, None
        got = payload[start:end]
        if got != self.expected:
            return payload, got
        return payload[:i] + self.replacement + payload[end + 1 :], None

    def _slow(self, payload: bytes) -> tuple[bytes, bytes | None]:
        """Non-compact JSON (``"model": "x"``): parse, check and re-encode."""
        offset = 6 if payload.startswith(b"data: ") else 0
        try:
            data = orjson.loads(payload[offset:])
        except orjson.JSONDecodeError:
            return payload, None
        if not isinstance(data, dict) or not isinstance(data.get("model"), str):
            return payload, None
        got = data["model"].encode()
        if got != self.expected:
            return payload, got
        data["model"] = orjson.loads(self.replacement[len(b'"model":') :])
        return payload[:offset] + orjson.dumps(data), None


def make_rewriter(expected_model: str, client_model: str) -> Rewriter:
    return Rewriter(expected_model.encode(), b'"model":' + orjson.dumps(client_model))


def parse_usage(payload: bytes) -> Usage | None:
    i = payload.rfind(b'"usage":{')
    if i < 0:
        return None
    vals = {m.group(1).decode(): int(m.group(2)) for m in _USAGE_RE.finditer(payload, i)}
    if not vals:
        return None
    return Usage(
        prompt_tokens=vals.get("prompt_tokens", 0),
        completion_tokens=vals.get("completion_tokens", 0),
        total_tokens=vals.get(
            "total_tokens", vals.get("prompt_tokens", 0) + vals.get("completion_tokens", 0)
        ),
    )


def _error_data(message: str, code: str) -> bytes:
    err = {"error": {"message": message, "type": "server_error", "param": None, "code": code}}
    return b"data: " + orjson.dumps(err) + b"\n\n"


def error_event(message: str, code: str = "upstream_error") -> bytes:
    return _error_data(message, code) + DONE + b"\n\n"


def engine_error_event(event: bytes) -> bytes:
    """The engine's own in-band error event (vLLM: ``data: {"error": {"message", "type", "param",
    "code": <int>}}``, from ``json.dumps``, then its ``[DONE]``) in the gateway's error shape: the
    engine's message, ``type`` ``server_error``, ``code`` ``engine_error``."""
    message = "the engine failed while streaming the answer"
    try:
        err = orjson.loads(event[6:]).get("error")
        if isinstance(err, dict) and isinstance(err.get("message"), str) and err["message"]:
            message = f"replica error: {err['message'][:1000]}"
    except (orjson.JSONDecodeError, AttributeError):
        pass
    return _error_data(message, ENGINE_ERROR)


class StreamRelay:
    """Turns an upstream SSE response into the client's byte stream (see module docstring)."""

    def __init__(
        self,
        resp: UpstreamResponse,
        rewriter: Rewriter,
        result: ForwardResult,
        *,
        client_wants_usage: bool,
        on_wrong: Callable[[bytes], Awaitable[None]],
        on_end: Callable[[], None],
    ) -> None:
        self._resp = resp
        self._rw = rewriter
        self._result = result
        self._keep_usage = client_wants_usage
        self._on_wrong = on_wrong
        self._on_end = on_end
        self._buf = b""
        self._done = False
        self._failed = False
        self._pending_wrong: bytes | None = None
        self._chunks = resp.content.iter_any()

    def _events(self, data: bytes) -> tuple[bytes, bytes | None]:
        """Process the complete events in buffer + data: (output bytes, wrong model name or None)."""
        buf = self._buf + data
        last = buf.rfind(b"\n\n")
        if last < 0:
            self._buf = buf
            return b"", None
        self._buf = buf[last + 2 :]
        out: list[bytes] = []
        for ev in buf[: last + 2].split(b"\n\n"):
            if not ev:
                continue
            if ev.startswith(b"data: {"):
                if ev.startswith(ERROR_EVENT):  # the engine failed after the stream started
                    self._result.stream_error = ENGINE_ERROR
                    out.append(engine_error_event(ev))
                    continue
                if b'"usage":{' in ev:
                    u = parse_usage(ev)
                    if u is not None:
                        self._result.usage = u
                    if not self._keep_usage and b'"choices":[]' in ev:
                        continue
                ev, wrong = self._rw.rewrite(ev)
                if wrong is not None:
                    return b"".join(out), wrong
            elif ev.startswith(DONE):
                self._done = True
            out.append(ev + b"\n\n")
        return b"".join(out), None

    async def first(self) -> bytes:
        """Read until the first complete event (or the end); raises WrongAdapter before any byte is sent."""
        for _ in range(10_000):
            try:
                data = await self._chunks.__anext__()
            except StopAsyncIteration:
                return self._tail_on_eof()
            except TimeoutError as exc:
                raise UpstreamTimeout("replica did not start the answer in time") from exc
            except (aiohttp.ClientError, OSError) as exc:
                raise Retryable(f"replica failed before the first event: {exc}") from exc
            out, wrong = self._events(data)
            if wrong is not None:
                if not out:
                    await self._on_wrong(wrong)
                    raise WrongAdapter(f"replica answered for model {wrong.decode(errors='replace')!r}")
                self._pending_wrong = wrong  # reported after the good events before it
            if out:
                return out
        return b""

    def _fail(self, message: str, code: str = "upstream_error") -> bytes:
        self._failed = True
        self._result.stream_error = code
        return error_event(message, code)

    def _tail_on_eof(self) -> bytes:
        if self._done:
            return b""
        return self._fail("the replica ended the stream without finishing it")

    async def iterate(self, first: bytes) -> AsyncIterator[bytes]:
        try:
            if first:
                yield first
            if self._pending_wrong is not None:
                await self._on_wrong(self._pending_wrong)
                yield self._fail("the replica answered with another adapter", "wrong_adapter")
                return
            if self._failed:
                return
            while not self._done:
                try:
                    data = await self._chunks.__anext__()
                except StopAsyncIteration:
                    tail = self._tail_on_eof()
                    if tail:
                        yield tail
                    return
                except TimeoutError as exc:  # idle: nothing for upstream_idle_timeout_s
                    log.warning(
                        "replica went silent mid-stream",
                        extra={"replica": self._result.replica, "error": str(exc) or "idle timeout"},
                    )
                    yield self._fail("the replica stopped sending the answer", "upstream_timeout")
                    return
                except (aiohttp.ClientError, OSError) as exc:
                    log.warning(
                        "replica failed mid-stream",
                        extra={"replica": self._result.replica, "error": str(exc)},
                    )
                    yield self._fail("the replica failed while streaming the answer")
                    return
                out, wrong = self._events(data)
                if out:
                    yield out
                if wrong is not None:
                    await self._on_wrong(wrong)
                    yield self._fail("the replica answered with another adapter", "wrong_adapter")
                    return
        finally:
            # Closing (also on client disconnect) drops the connection, which cancels upstream work.
            if not self._done:
                self._resp.close()
            else:
                self._resp.release()
            self._on_end()


async def read_body(resp: UpstreamResponse) -> bytes:
    try:
        return await resp.read()
    except (aiohttp.ClientError, OSError) as exc:
        raise Retryable(f"replica failed while sending the answer: {exc}") from exc
    except TimeoutError as exc:
        raise UpstreamTimeout("replica did not answer in time") from exc
