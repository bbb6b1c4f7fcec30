"""Request parsing for completions/chat: vLLM's validation, ``_check_model``, usage objects."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from simulator.asgi_io import validation_message
from simulator.engine import EngineEvent
from simulator.lora_api import LoadError, summarize_input
from simulator.textgen import Generation, count_tokens, render_chat

if TYPE_CHECKING:
    from simulator.app import SimApp


@dataclass
class Choice:
    index: int
    gen: Generation
    req_id: str
    prompt_tokens: int
    max_tokens: int | None = None  # the request's max_tokens (vllm:request_params_max_tokens)
    latency_factor: float = 1.0  # the served adapter's simulated behaviour stretches its times
    # shared by the n choices of one prompt (vLLM's ParentRequest): [unfinished, max generated, n]
    group: list[int] = field(default_factory=lambda: [1, 0, 1])


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
    request_seed: int | None  # the request's own ``seed`` (None: unseeded, like vLLM sampling)
    stop: list[str] | None
    stream: bool
    include_usage: bool
    continuous_usage: bool
    choices: list[Choice] = field(default_factory=list)
    # a behaviour's ``stream_error_rate`` drew this stream: it fails after this many tokens
    stream_error_after: int | None = None


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
    lora, identity = app.resolve_request(body, model)  # LoadError 404 for an unknown name
    max_tokens = _int_field(body, "max_completion_tokens", None, 1) if chat else None
    if max_tokens is None:
        max_tokens = _int_field(body, "max_tokens", app.config.default_max_tokens, 1)
    assert max_tokens is not None
    n = _int_field(body, "n", 1, 1)
    assert n is not None
    if n > 64:
        raise _bad("n must be at most 64.", "n")
    seed = _int_field(body, "seed", None, -(2**63))
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
        request_seed=seed,
        stop=stop or None,
        stream=stream,
        include_usage=bool(opts and opts.get("include_usage")),
        continuous_usage=bool(opts and opts.get("continuous_usage_stats")),
    )


def usage_obj(prompt: int, completion: int) -> dict[str, Any]:
    """``usage`` of a whole (non-streamed) answer, as vLLM 0.32's ``UsageInfo.model_dump()``:
    both details null (no ``--enable-prompt-tokens-details``, no reasoning parser)."""
    return {
        "prompt_tokens": prompt,
        "total_tokens": prompt + completion,
        "completion_tokens": completion,
        "prompt_tokens_details": None,
        "completion_tokens_details": None,
    }


def observe_choice(app: SimApp, ch: Choice, ev: EngineEvent) -> None:
    t = ev.times
    if t is None:
        return
    metrics = app.metrics
    num_tokens = ch.gen.num_tokens
    f, t0 = ch.latency_factor, t.arrival

    def at(x: float) -> float:  # the time the client sees (a behaviour's latency_factor)
        return t0 + (x - t0) * f

    metrics.observe_finished(
        prompt_tokens=ch.prompt_tokens,
        completion_tokens=num_tokens,
        finish_reason=ch.gen.finish_reason,
        arrival=t0,
        scheduled_at=at(t.scheduled_at if t.scheduled_at is not None else t0),
        first_token_at=at(t.first_token_at if t.first_token_at is not None else ev.time),
        finished_at=at(ev.time),
        max_tokens=ch.max_tokens,
    )
    g = ch.group
    g[0] -= 1
    if num_tokens > g[1]:
        g[1] = num_tokens
    if g[0] == 0:  # the prompt's last choice: its n and the longest of its choices
        metrics.observe_parent(g[2], g[1])
