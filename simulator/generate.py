"""``/v1/completions`` and ``/v1/chat/completions``: parse, submit to the engine, answer as vLLM 0.32 does."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import orjson

from simulator.asgi_io import JSON_CT, Request, send_error, send_response
from simulator.behaviours import Behaviour, Draws
from simulator.engine import EngineEvent
from simulator.lora_api import LoadError, read_json_object
from simulator.outputs import json_answer, refusal
from simulator.parsing import Choice, Parsed, observe_choice, parse_request, usage_obj
from simulator.sse import GENERATION_ERROR, AbortConnection, stream_response, stretch
from simulator.textgen import Generation, generate

if TYPE_CHECKING:
    from simulator.app import SimApp

__all__ = ["AbortConnection", "handle_generate"]

HEALTHY = Behaviour()


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
    served = p.lora or app.config.model
    behaviour = app.config.faults.behaviours.lookup(served) or HEALTHY
    draws = Draws.for_request(served, [text for text, _ in p.prompts], p.request_seed)
    fails = behaviour.error_rate > 0 and draws.draw("error") < behaviour.error_rate
    k = 0
    for text, ntok in p.prompts:
        group = [p.n, 0, p.n]  # one vLLM parent request per prompt
        for i in range(p.n):
            gen = _answer(p, behaviour, draws, text, i, k)
            if fails and k == 0:  # the engine fails this request after some tokens (vLLM: finish "error")
                cut = 1 + int(draws.draw("error-at") * gen.num_tokens)
                gen = Generation(gen.pieces[:cut], "error", None)
            ch = Choice(
                k, gen, f"{rid}-{k}", ntok, p.max_tokens, latency_factor=behaviour.latency_factor, group=group
            )
            p.choices.append(ch)
            k += 1
    rate = behaviour.stream_error_rate
    if p.stream and rate > 0 and draws.draw("stream-error") < rate:
        fewest = min(ch.gen.num_tokens for ch in p.choices)  # fails before the first choice ends
        p.stream_error_after = int(draws.draw("stream-error-at") * fewest)
    app.metrics.mark_traffic()
    app.in_flight += 1
    try:
        if p.stream:
            await stream_response(app, req, p, rid)
        else:
            await _unary(app, req, p, rid)
    finally:
        app.in_flight -= 1
        app.request_done()


def _answer(p: Parsed, behaviour: Behaviour, draws: Draws, text: str, i: int, k: int) -> Generation:
    """Choice ``i`` of prompt ``text`` (choice ``k`` of the request) as the behaviour shapes it."""
    if behaviour.refusal_rate > 0 and draws.draw("refusal", k) < behaviour.refusal_rate:
        return refusal(draws.draw("refusal-text", k), p.max_tokens)
    if behaviour.output != "text":
        broken = behaviour.output == "broken_json"
        return json_answer(p.identity, text, max_tokens=p.max_tokens, seed=p.seed, index=i, broken=broken)
    return generate(p.identity, text, max_tokens=p.max_tokens, seed=p.seed, index=i, stop=p.stop)


async def _unary(app: SimApp, req: Request, p: Parsed, rid: str) -> None:
    loop = asyncio.get_running_loop()
    futs = []
    t0 = time.monotonic()
    for ch in p.choices:
        fut: asyncio.Future[EngineEvent] = loop.create_future()
        futs.append(fut)
        app.driver.submit(ch.req_id, p.lora, ch.prompt_tokens, ch.gen.num_tokens, _resolver(fut, app, ch))
    try:
        if app.config.timing.is_zero:  # finishes within this loop turn: no disconnect watch needed
            await (futs[0] if len(futs) == 1 else asyncio.gather(*futs))
        elif not await _until_done_or_disconnect(req, futs):
            for ch in p.choices:  # the client went away: cancel, as vLLM does
                app.driver.abort(ch.req_id)
            return
    except asyncio.CancelledError:
        for ch in p.choices:
            app.driver.abort(ch.req_id)
        raise
    await stretch(t0, max(f.result().time for f in futs), p.choices[0].latency_factor)
    faults = app.config.faults
    if faults.stall_s > 0:
        await asyncio.sleep(faults.stall_s)
    if any(ch.gen.finish_reason == "error" for ch in p.choices):  # vLLM's GenerationError
        await send_error(req.send, 500, GENERATION_ERROR, "InternalServerError", None)
        return
    created = int(time.time())
    prompt_total = sum(ntok for _, ntok in p.prompts)
    completion_total = sum(ch.gen.num_tokens for ch in p.choices)
    choices: list[dict[str, Any]]
    if p.chat:
        choices = [
            {
                "index": ch.index,
                # vLLM 0.32's ChatMessage: ``reasoning`` (not ``reasoning_content``); an empty
                # ``tool_calls`` list is dropped from the body
                "message": {
                    "role": "assistant",
                    "content": ch.gen.text,
                    "refusal": None,
                    "annotations": None,
                    "audio": None,
                    "function_call": None,
                    "reasoning": None,
                },
                "logprobs": None,
                "finish_reason": ch.gen.finish_reason,
                "stop_reason": ch.gen.stop_reason,
                "token_ids": None,
                "routed_experts": None,
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
            "usage": usage_obj(prompt_total, completion_total),
            "prompt_logprobs": None,
            "prompt_token_ids": None,
            "prompt_text": None,
            "kv_transfer_params": None,
            "ec_transfer_params": None,
            "metrics": None,
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
                "routed_experts": None,
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
            "usage": usage_obj(prompt_total, completion_total),
            "kv_transfer_params": None,
            "ec_transfer_params": None,
            "metrics": None,
        }
    await send_response(req.send, 200, orjson.dumps(out), (JSON_CT,))


async def _until_done_or_disconnect(req: Request, futs: list[asyncio.Future[EngineEvent]]) -> bool:
    """Wait for every choice; False when the client disconnected first."""

    async def disconnected() -> None:
        for _ in range(1_000_000):
            if (await req.receive())["type"] == "http.disconnect":
                return

    done_all: asyncio.Future[Any] = asyncio.gather(*futs)
    watch: asyncio.Future[Any] = asyncio.ensure_future(disconnected())
    try:
        await asyncio.wait({done_all, watch}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watch.cancel()
    if done_all.done():
        return True
    done_all.cancel()
    return False


def _resolver(fut: asyncio.Future[EngineEvent], app: SimApp, ch: Choice) -> Callable[[EngineEvent], None]:
    def cb(ev: EngineEvent) -> None:
        if ev.kind == "finished":
            observe_choice(app, ch, ev)
            if not fut.done():
                fut.set_result(ev)

    return cb
