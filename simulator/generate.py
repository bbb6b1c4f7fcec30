"""``/v1/completions`` and ``/v1/chat/completions``: validation, model check, SSE (VLLM.md §3, §9)."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import orjson

from simulator.asgi_io import JSON_CT, Request, send_error, send_response, validation_message
from simulator.engine import EngineEvent
from simulator.lora_api import LoadError, read_json_object, summarize_input
from simulator.textgen import Generation, count_tokens, generate, render_chat

if TYPE_CHECKING:
    from simulator.app import SimApp

SSE_HEADERS = [(b"content-type", b"text/event-stream; charset=utf-8"), (b"cache-control", b"no-cache")]
_DONE = b"data: [DONE]\n\n"


class AbortConnection(Exception):
    """Raised inside a streaming response to make the server close the connection abruptly."""


@dataclass
class Choice:
    index: int
    gen: Generation
    req_id: str
    prompt_tokens: int


@dataclass
class Parsed:
    chat: bool
    model: str  # as requested (echoed)
    lora: str | None
    identity: str
    prompts: list[tuple[str, int]]  # (text, token count)
    max_tokens: int
    n: int
    seed: int
    stop: list[str] | None
    stream: bool
    include_usage: bool
    continuous_usage: bool
    choices: list[Choice] = field(default_factory=list)


def _bad(message: str, param: str | None = None) -> LoadError:
    return LoadError(400, "BadRequestError", message, param)


def _int_field(body: dict[str, Any], name: str, default: int | None, minimum: int) -> int | None:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise LoadError(
            400,
            "Bad Request",
            validation_message(
                [
                    {
                        "type": "int_type",
                        "loc": f"body.{name}",
                        "msg": "Input should be a valid integer",
                        "input": summarize_input(value),
                    }
                ]
            ),
            f"body.{name}",
        )
    if value < minimum:
        raise _bad(f"{name} must be at least {minimum}, got {value}.", name)
    return value


def parse_request(app: SimApp, body: dict[str, Any], chat: bool) -> Parsed:
    """Validate like vLLM's pydantic models + ``_check_model``; raise ``LoadError`` on bad input."""
    field_name = "messages" if chat else "prompt"
    if field_name not in body:
        raise LoadError(
            400,
            "Bad Request",
            validation_message(
                [
                    {
                        "type": "missing",
                        "loc": f"body.{field_name}",
                        "msg": "Field required",
                        "input": f"<dict of {len(body)} items>",
                    }
                ]
            ),
            f"body.{field_name}",
        )
    stream = body.get("stream") or False
    if not isinstance(stream, bool):
        raise _bad("stream must be a boolean", "stream")
    opts = body.get("stream_options")
    if opts is not None and not stream:
        raise _bad(
            "Stream options can only be defined when `stream=True`. (parameter=stream_options)",
            "stream_options",
        )
    if opts is not None and not isinstance(opts, dict):
        raise _bad("stream_options must be an object", "stream_options")
    prompts: list[tuple[str, int]] = []
    if chat:
        messages = body["messages"]
        if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
            raise LoadError(
                400,
                "Bad Request",
                validation_message(
                    [
                        {
                            "type": "list_type",
                            "loc": "body.messages",
                            "msg": "Input should be a valid list",
                            "input": summarize_input(messages),
                        }
                    ]
                ),
                "body.messages",
            )
        text = render_chat(messages)
        prompts.append((text, count_tokens(text)))
    else:
        prompt = body["prompt"]
        if isinstance(prompt, str):
            prompts.append((prompt, count_tokens(prompt)))
        elif isinstance(prompt, list) and prompt and all(isinstance(p, str) for p in prompt):
            prompts.extend((p, count_tokens(p)) for p in prompt)
        elif (
            isinstance(prompt, list)
            and prompt
            and all(isinstance(p, int) and not isinstance(p, bool) for p in prompt)
        ):
            prompts.append((" ".join(map(str, prompt)), len(prompt)))
        else:
            raise _bad("prompt must be a string, a list of strings or a list of token ids", "prompt")
    model = body.get("model") or ""
    if not isinstance(model, str):
        raise _bad("model must be a string", "model")
    lora, identity = app.resolve_model(model)  # LoadError 404 for an unknown name
    max_tokens = _int_field(body, "max_completion_tokens", None, 1) if chat else None
    if max_tokens is None:
        max_tokens = _int_field(body, "max_tokens", app.config.default_max_tokens, 1)
    assert max_tokens is not None
    n = _int_field(body, "n", 1, 1)
    assert n is not None
    if n > 64:
        raise _bad("n must be at most 64.", "n")
    seed = _int_field(body, "seed", 0, -(2**63))
    stop = body.get("stop")
    if isinstance(stop, str):
        stop = [stop]
    if stop is not None and not (isinstance(stop, list) and all(isinstance(s, str) for s in stop)):
        raise _bad("stop must be a string or a list of strings", "stop")
    for _text, ntok in prompts:
        limit = app.config.max_model_len
        if ntok > limit:
            raise _bad(
                f"This model's maximum context length is {limit} tokens. However, your request has "
                f"{ntok} input tokens. Please reduce the length of the input messages."
            )
        if ntok + max_tokens > limit:
            raise _bad(
                f"'max_tokens' or 'max_completion_tokens' is too large: {max_tokens}. This model's maximum "
                f"context length is {limit} tokens and your request has {ntok} input tokens "
                f"({max_tokens} > {limit} - {ntok})."
            )
    return Parsed(
        chat=chat,
        model=model or app.config.model,
        lora=lora,
        identity=identity,
        prompts=prompts,
        max_tokens=max_tokens,
        n=n,
        seed=int(seed or 0) ^ app.config.seed,
        stop=stop or None,
        stream=stream,
        include_usage=bool(opts and opts.get("include_usage")),
        continuous_usage=bool(opts and opts.get("continuous_usage_stats")),
    )


def _usage(prompt: int, completion: int) -> dict[str, Any]:
    return {
        "prompt_tokens": prompt,
        "total_tokens": prompt + completion,
        "completion_tokens": completion,
        "prompt_tokens_details": None,
    }


async def handle_generate(app: SimApp, req: Request, chat: bool) -> None:
    try:
        body = await read_json_object(req)
        p = parse_request(app, body, chat)
        if app.config.faults.dead:
            raise LoadError(500, "InternalServerError", app.dead_message)
    except LoadError as exc:
        await send_error(req.send, exc.status, exc.message, exc.type_, exc.param)
        return
    rid = os.urandom(8).hex()
    k = 0
    for text, ntok in p.prompts:
        for i in range(p.n):
            gen = generate(p.identity, text, max_tokens=p.max_tokens, seed=p.seed, index=i, stop=p.stop)
            p.choices.append(Choice(k, gen, f"{rid}-{k}", ntok))
            k += 1
    app.metrics.mark_traffic()
    app.in_flight += 1
    try:
        if p.stream:
            await _stream(app, req, p, rid)
        else:
            await _unary(app, req, p, rid)
    finally:
        app.in_flight -= 1
        app.request_done()


def _observe(app: SimApp, ch: Choice, ev: EngineEvent) -> None:
    t = ev.times
    if t is None:
        return
    app.metrics.observe_finished(
        prompt_tokens=ch.prompt_tokens,
        completion_tokens=ch.gen.num_tokens,
        finish_reason=ch.gen.finish_reason,
        arrival=t.arrival,
        scheduled_at=t.scheduled_at if t.scheduled_at is not None else t.arrival,
        first_token_at=t.first_token_at if t.first_token_at is not None else ev.time,
        finished_at=ev.time,
    )


async def _unary(app: SimApp, req: Request, p: Parsed, rid: str) -> None:
    loop = asyncio.get_running_loop()
    futs = []
    for ch in p.choices:
        fut: asyncio.Future[EngineEvent] = loop.create_future()
        futs.append(fut)
        app.driver.submit(ch.req_id, p.lora, ch.prompt_tokens, ch.gen.num_tokens, _resolver(fut, app, ch))
    try:
        if len(futs) == 1:
            await futs[0]
        else:
            await asyncio.gather(*futs)
    except asyncio.CancelledError:
        for ch in p.choices:
            app.driver.abort(ch.req_id)
        raise
    faults = app.config.faults
    if faults.stall_s > 0:
        await asyncio.sleep(faults.stall_s)
    created = int(time.time())
    prompt_total = sum(ntok for _, ntok in p.prompts)
    completion_total = sum(ch.gen.num_tokens for ch in p.choices)
    choices: list[dict[str, Any]]
    if p.chat:
        choices = [
            {
                "index": ch.index,
                "message": {
                    "role": "assistant",
                    "content": ch.gen.text,
                    "refusal": None,
                    "annotations": None,
                    "audio": None,
                    "function_call": None,
                    "tool_calls": [],
                    "reasoning_content": None,
                },
                "logprobs": None,
                "finish_reason": ch.gen.finish_reason,
                "stop_reason": ch.gen.stop_reason,
                "token_ids": None,
            }
            for ch in p.choices
        ]
        out: dict[str, Any] = {
            "id": f"chatcmpl-{rid}",
            "object": "chat.completion",
            "created": created,
            "model": p.model,
            "choices": choices,
            "service_tier": None,
            "system_fingerprint": app.fingerprint,
            "usage": _usage(prompt_total, completion_total),
            "prompt_logprobs": None,
            "prompt_token_ids": None,
            "kv_transfer_params": None,
        }
    else:
        choices = [
            {
                "index": ch.index,
                "text": ch.gen.text,
                "logprobs": None,
                "finish_reason": ch.gen.finish_reason,
                "stop_reason": ch.gen.stop_reason,
                "token_ids": None,
                "prompt_logprobs": None,
                "prompt_token_ids": None,
            }
            for ch in p.choices
        ]
        out = {
            "id": f"cmpl-{rid}",
            "object": "text_completion",
            "created": created,
            "model": p.model,
            "choices": choices,
            "service_tier": None,
            "system_fingerprint": app.fingerprint,
            "usage": _usage(prompt_total, completion_total),
            "kv_transfer_params": None,
        }
    await send_response(req.send, 200, orjson.dumps(out), (JSON_CT,))


def _resolver(fut: asyncio.Future[EngineEvent], app: SimApp, ch: Choice) -> Callable[[EngineEvent], None]:
    def cb(ev: EngineEvent) -> None:
        if ev.kind == "finished":
            _observe(app, ch, ev)
            if not fut.done():
                fut.set_result(ev)

    return cb


async def _stream(app: SimApp, req: Request, p: Parsed, rid: str) -> None:
    queue: asyncio.Queue[tuple[Choice, EngineEvent] | None] = asyncio.Queue()
    by_id = {ch.req_id: ch for ch in p.choices}

    def cb(ev: EngineEvent) -> None:
        ch = by_id[ev.req_id]
        if ev.kind == "finished":
            _observe(app, ch, ev)
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
        return {"usage": _usage(prompt_total, sum(completion.values()))} if p.continuous_usage else {}

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
