"""SSE streaming of completions/chat (VLLM.md §9) with the stream faults (cut, stall, dead)."""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any

import orjson

from simulator.asgi_io import Request
from simulator.engine import EngineEvent
from simulator.parsing import Choice, Parsed, observe_choice, usage_obj

if TYPE_CHECKING:
    from simulator.app import SimApp

SSE_HEADERS = [(b"content-type", b"text/event-stream; charset=utf-8"), (b"cache-control", b"no-cache")]
_DONE = b"data: [DONE]\n\n"


class AbortConnection(Exception):
    """Raised inside a streaming response to make the server close the connection abruptly."""


async def stream_response(app: SimApp, req: Request, p: Parsed, rid: str) -> None:
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
    prompt_total = sum(ntok for _, ntok in p.prompts)
    completion: dict[str, int] = {}

    def chunk(choices: list[dict[str, Any]], **extra: Any) -> bytes:
        return b"data: " + orjson.dumps({**head, "choices": choices, **extra}) + b"\n\n"

    def usage_extra() -> dict[str, Any]:
        return {"usage": usage_obj(prompt_total, sum(completion.values()))} if p.continuous_usage else {}

    await req.send({"type": "http.response.start", "status": 200, "headers": SSE_HEADERS})
    watcher = asyncio.create_task(watch_disconnect())
    for ch in p.choices:
        app.driver.submit(ch.req_id, p.lora, ch.prompt_tokens, ch.gen.num_tokens, cb, want_tokens=True)
    sent_tokens = 0
    remaining = len(p.choices)
    stalled = False
    try:
        if p.chat:
            for ch in p.choices:
                await req.send(
                    {
                        "type": "http.response.body",
                        "more_body": True,
                        "body": chunk(
                            [
                                {
                                    "index": ch.index,
                                    "delta": {"role": "assistant", "content": ""},
                                    "logprobs": None,
                                    "finish_reason": None,
                                }
                            ],
                            prompt_token_ids=None,
                            prompt_text=None,
                        ),
                    }
                )
        for _ in range(10_000_000):
            if remaining == 0:
                break
            item = await queue.get()
            if item is None:  # client went away
                return
            ch, ev = item
            if faults.dead:  # the engine died after the stream started: vLLM's in-band error
                err = orjson.dumps({"error": {"message": app.dead_message, "type": "InternalServerError",
                                              "param": None, "code": 500}})  # fmt: skip
                await req.send({"type": "http.response.body", "body": b"data: " + err + b"\n\n" + _DONE})
                return
            if ev.kind == "token":
                if die_after is not None and sent_tokens >= die_after:
                    raise AbortConnection("fault injection: die mid-stream")
                if faults.stall_s > 0 and not stalled and sent_tokens >= faults.stall_after_tokens:
                    stalled = True
                    await asyncio.sleep(faults.stall_s)
                piece = ch.gen.pieces[ev.index - 1] if ev.index <= len(ch.gen.pieces) else ""
                completion[ch.req_id] = ev.index
                if p.chat:
                    c = {
                        "index": ch.index,
                        "delta": {"content": piece},
                        "logprobs": None,
                        "finish_reason": None,
                        "token_ids": None,
                    }
                else:
                    c = {
                        "index": ch.index,
                        "text": piece,
                        "logprobs": None,
                        "finish_reason": None,
                        "stop_reason": None,
                        "token_ids": None,
                    }
                await req.send(
                    {"type": "http.response.body", "body": chunk([c], **usage_extra()), "more_body": True}
                )
                sent_tokens += 1
            elif ev.kind == "finished":
                remaining -= 1
                if p.chat:
                    c = {
                        "index": ch.index,
                        "delta": {"content": ""},
                        "logprobs": None,
                        "finish_reason": ch.gen.finish_reason,
                        "stop_reason": ch.gen.stop_reason,
                        "token_ids": None,
                    }
                else:
                    c = {
                        "index": ch.index,
                        "text": "",
                        "logprobs": None,
                        "finish_reason": ch.gen.finish_reason,
                        "stop_reason": ch.gen.stop_reason,
                        "token_ids": None,
                    }
                await req.send(
                    {"type": "http.response.body", "body": chunk([c], **usage_extra()), "more_body": True}
                )
        tail = b""
        if p.include_usage:
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
