"""SSE streaming of completions/chat (as vLLM 0.32 does) with the stream faults (cut, stall, dead)."""

from __future__ import annotations

import asyncio
import json
import time
from typing import TYPE_CHECKING, Any

import orjson

from simulator.asgi_io import Request
from simulator.engine import EngineEvent
from simulator.parsing import Choice, Parsed, observe_choice

if TYPE_CHECKING:
    from simulator.app import SimApp

SSE_HEADERS = [(b"content-type", b"text/event-stream; charset=utf-8"), (b"cache-control", b"no-cache")]
_DONE = b"data: [DONE]\n\n"
#: vLLM's ``GenerationError`` message (a request the engine finished with reason "error").
GENERATION_ERROR = "Internal server error"


class AbortConnection(Exception):
    """Raised inside a streaming response to make the server close the connection abruptly."""


async def stretch(t0: float, engine_time: float, factor: float) -> None:
    """Hold an answer until ``t0 + factor × (engine_time − t0)`` (a behaviour's latency_factor)."""
    if factor != 1.0:
        delay = t0 + (engine_time - t0) * factor - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)


def _error_event(message: str) -> bytes:
    err = {"error": {"message": message, "type": "InternalServerError", "param": None, "code": 500}}
    return b"data: " + orjson.dumps(err) + b"\n\n" + _DONE


#: What a behaviour's ``stream_error_rate`` fails a stream with: vLLM's stream generators catch an
#: exception raised after the stream started and send ``create_streaming_error_response(e)``
#: (``json.dumps``, so with spaces; ``BadRequestError`` 400 by default) before their ``[DONE]``.
STREAM_ERROR_EVENT = (
    b"data: "
    + json.dumps(
        {"error": {"message": "Simulated failure in the stream generator (stream_error_rate)",
                   "type": "BadRequestError", "param": None, "code": 400}}
    ).encode()
    + b"\n\n"
    + _DONE
)  # fmt: skip


async def stream_response(app: SimApp, req: Request, p: Parsed, rid: str) -> None:
    """vLLM 0.32's chunk sequence and key sets (``exclude_unset``): per chat choice a role chunk
    with the first output, one chunk per token, a finish chunk (with ``system_fingerprint``
    unless a usage chunk follows), the usage chunk (``include_usage``), ``[DONE]``; an engine
    failure is ``data: {"error": …}`` then ``[DONE]`` on the HTTP 200."""
    queue: asyncio.Queue[tuple[Choice, EngineEvent] | None] = asyncio.Queue()
    by_id = {ch.req_id: ch for ch in p.choices}

    def cb(ev: EngineEvent) -> None:
        ch = by_id[ev.req_id]
        if ev.kind == "finished":
            observe_choice(app, ch, ev)
        if ev.kind != "first_token":
            queue.put_nowait((ch, ev))

    async def watch_disconnect() -> None:
        for _ in range(1_000_000):
            msg = await req.receive()
            if msg["type"] == "http.disconnect":
                queue.put_nowait(None)
                return

    created = int(time.time())
    obj = "chat.completion.chunk" if p.chat else "text_completion"
    pid = f"chatcmpl-{rid}" if p.chat else f"cmpl-{rid}"
    head = {"id": pid, "object": obj, "created": created, "model": p.model}
    faults = app.config.faults
    die_after: int | None = None
    if faults.die_after_tokens is not None and (faults.die_streams is None or faults.die_streams > 0):
        die_after = faults.die_after_tokens
        if faults.die_streams is not None:
            faults.die_streams -= 1
    factor = p.choices[0].latency_factor
    completion: dict[str, int] = {}

    def chunk(choices: list[dict[str, Any]], **extra: Any) -> bytes:
        return b"data: " + orjson.dumps({**head, "choices": choices, **extra}) + b"\n\n"

    def usage_extra(ch: Choice, tokens: int, finished: bool = False) -> dict[str, Any]:
        extra: dict[str, Any] = {}
        if finished and not p.include_usage:  # vLLM stamps the terminal chunk only
            extra["system_fingerprint"] = app.fingerprint
        if p.continuous_usage:  # per choice, as vLLM; chat sets completion_tokens_details (null)
            usage: dict[str, Any] = {
                "prompt_tokens": ch.prompt_tokens,
                "total_tokens": ch.prompt_tokens + tokens,
                "completion_tokens": tokens,
            }
            if p.chat:
                usage["completion_tokens_details"] = None
            extra["usage"] = usage
        return extra

    async def send(body: bytes) -> None:
        await req.send({"type": "http.response.body", "body": body, "more_body": True})

    async def send_roles() -> None:  # vLLM sends them with the engine's first output
        for ch in p.choices:
            role = {"index": ch.index, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                    "finish_reason": None}  # fmt: skip
            await send(chunk([role], prompt_token_ids=None, prompt_text=None, **usage_extra(ch, 0)))

    await req.send({"type": "http.response.start", "status": 200, "headers": SSE_HEADERS})
    watcher = asyncio.create_task(watch_disconnect())
    t0 = time.monotonic()
    for ch in p.choices:
        app.driver.submit(ch.req_id, p.lora, ch.prompt_tokens, ch.gen.num_tokens, cb, want_tokens=True)
    sent_tokens = 0
    remaining = len(p.choices)
    stalled = False
    started = not p.chat
    try:
        for _ in range(10_000_000):
            if remaining == 0:
                break
            item = await queue.get()
            if item is None:  # client went away
                return
            ch, ev = item
            await stretch(t0, ev.time, factor)
            if not started:
                started = True
                await send_roles()
            if faults.dead:  # the engine died after the stream started: vLLM's in-band error
                await req.send({"type": "http.response.body", "body": _error_event(app.dead_message)})
                return
            failing = ch.gen.finish_reason == "error"
            if p.stream_error_after is not None and sent_tokens >= p.stream_error_after:
                await req.send({"type": "http.response.body", "body": STREAM_ERROR_EVENT})
                return
            if ev.kind == "token":
                if failing and ev.index >= ch.gen.num_tokens:
                    continue  # the token the engine failed on: the finished event sends the error
                if die_after is not None and sent_tokens >= die_after:
                    raise AbortConnection("fault injection: die mid-stream")
                if faults.stall_s > 0 and not stalled and sent_tokens >= faults.stall_after_tokens:
                    stalled = True
                    await asyncio.sleep(faults.stall_s)
                piece = ch.gen.pieces[ev.index - 1] if ev.index <= len(ch.gen.pieces) else ""
                completion[ch.req_id] = ev.index
                if p.chat:
                    c = {"index": ch.index, "delta": {"content": piece}, "logprobs": None,
                         "finish_reason": None, "token_ids": None}  # fmt: skip
                else:
                    c = {"index": ch.index, "text": piece, "logprobs": None, "finish_reason": None,
                         "stop_reason": None, "prompt_token_ids": None, "token_ids": None}  # fmt: skip
                await send(chunk([c], **usage_extra(ch, ev.index)))
                sent_tokens += 1
            elif ev.kind == "finished":
                if failing:  # vLLM's GenerationError in the stream
                    await req.send({"type": "http.response.body", "body": _error_event(GENERATION_ERROR)})
                    return
                remaining -= 1
                tokens = completion.get(ch.req_id, ch.gen.num_tokens)
                if p.chat:
                    c = {"index": ch.index, "delta": {"content": ""}, "logprobs": None,
                         "finish_reason": ch.gen.finish_reason, "stop_reason": ch.gen.stop_reason,
                         "token_ids": None}  # fmt: skip
                else:
                    c = {"index": ch.index, "text": "", "logprobs": None,
                         "finish_reason": ch.gen.finish_reason, "stop_reason": ch.gen.stop_reason,
                         "prompt_token_ids": None, "token_ids": None}  # fmt: skip
                await send(chunk([c], **usage_extra(ch, tokens, finished=True)))
        tail = b""
        if p.include_usage:
            prompt_total = sum(ntok for _, ntok in p.prompts)
            total = sum(ch.gen.num_tokens for ch in p.choices)
            tail = chunk(
                [],
                usage={
                    "prompt_tokens": prompt_total,
                    "total_tokens": prompt_total + total,
                    "completion_tokens": total,
                },
                system_fingerprint=app.fingerprint,
            )
        await req.send({"type": "http.response.body", "body": tail + _DONE, "more_body": False})
    finally:
        watcher.cancel()
        for ch in p.choices:
            app.driver.abort(ch.req_id)
