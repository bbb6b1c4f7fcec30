"""Parse and check an OpenAI completion request body; estimate its tokens for admission.

Only what the gateway itself needs is checked strictly (``model``, ``messages`` / ``prompt``,
``stream``, ``stream_options``, ``max_tokens``, ``user``, ``n``), and the JSON types of the
sampling parameters (``gateway.sampling``: ``temperature: "hot"`` is a 400, as vLLM answers it);
every other field, and every range, goes to the replica, which answers its own 400s (passed
through in our error shape). Any malformed body is a
400 ``invalid_request`` — never a 500: that includes NUL or other control characters in the
strings the gateway reads itself (``model``, ``user``, a message's ``role``; the text sent to the
model is the replica's business), a ``max_tokens`` beyond 2³¹−1 and JSON nested past orjson's
limit.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import orjson

from gateway.errors import invalid
from gateway.sampling import CHAT, COMPLETIONS, check_sampling
from kit.inputs import CONTROL_MESSAGE, INT32_MAX, has_control

Endpoint = Literal["chat/completions", "completions"]


@dataclass(slots=True)
class ParsedRequest:
    body: dict[str, Any]
    model: str
    stream: bool
    include_usage: bool
    user: str | None
    max_tokens: int | None
    prompt_chars: int
    n: int


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _content_chars(content: Any) -> int:
    """Characters of a chat message's content: a string, or a list of parts with ``text``."""
    if content is None:
        return 0
    if isinstance(content, str):
        return len(content)
    if isinstance(content, list):
        total = 0
        for part in content:
            if isinstance(part, dict):
                text = part.get("text")
                if isinstance(text, str):
                    total += len(text)
            elif isinstance(part, str):
                total += len(part)
        return total
    raise invalid("'content' must be a string, an array of content parts or null", "messages")


def _check_messages(messages: Any) -> int:
    if not isinstance(messages, list) or not messages:
        raise invalid("'messages' must be a non-empty array", "messages")
    chars = 0
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            raise invalid(f"'messages[{i}]' must be an object", "messages")
        role = m.get("role")
        if not isinstance(role, str) or not role:
            raise invalid(f"'messages[{i}].role' must be a non-empty string", "messages")
        if has_control(role):
            raise invalid(f"'messages[{i}].role' {CONTROL_MESSAGE}", "messages")
        chars += _content_chars(m.get("content")) + 16  # role/format overhead, ~4 tokens
    return chars


def _check_prompt(prompt: Any) -> int:
    if isinstance(prompt, str):
        return len(prompt)
    if isinstance(prompt, list) and prompt:
        if all(isinstance(p, str) for p in prompt):
            return sum(len(p) for p in prompt)
        if all(_is_int(p) for p in prompt):
            return 4 * len(prompt)  # token ids: one token each
        if all(isinstance(p, list) and p and all(_is_int(t) for t in p) for p in prompt):
            return 4 * sum(len(p) for p in prompt)
    raise invalid("'prompt' must be a string, an array of strings, or an array of token ids", "prompt")


def parse_request(raw: bytes, endpoint: Endpoint) -> ParsedRequest:
    """Check ``raw`` as the body of ``POST /v1/<endpoint>``; raise a 400 :class:`GatewayError`."""
    if not raw:
        raise invalid("request body is empty; expected a JSON object")
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as e:
        raise invalid(f"request body is not valid JSON: {e}") from None
    if not isinstance(body, dict):
        raise invalid("request body must be a JSON object")
    model = body.get("model")
    if model is None:
        raise invalid("you must provide a model parameter", "model")
    if not isinstance(model, str) or not model.strip():
        raise invalid("'model' must be a non-empty string", "model")
    if has_control(model):
        raise invalid(f"'model' {CONTROL_MESSAGE}", "model")
    if endpoint == "chat/completions":
        if "messages" not in body:
            raise invalid("'messages' is a required property", "messages")
        chars = _check_messages(body["messages"])
    else:
        if "prompt" not in body:
            raise invalid("'prompt' is a required property", "prompt")
        chars = _check_prompt(body["prompt"])
    stream = body.get("stream", False)
    if stream is None:
        stream = False
    if not isinstance(stream, bool):
        raise invalid("'stream' must be a boolean", "stream")
    include_usage = False
    opts = body.get("stream_options")
    if opts is not None:
        if not stream:
            raise invalid("Stream options can only be defined when `stream=True`.", "stream_options")
        if not isinstance(opts, dict):
            raise invalid("'stream_options' must be an object", "stream_options")
        iu = opts.get("include_usage", False)
        if iu is not None and not isinstance(iu, bool):
            raise invalid("'stream_options.include_usage' must be a boolean", "stream_options")
        include_usage = bool(iu)
    max_tokens: int | None = None
    for name in ("max_tokens", "max_completion_tokens"):
        v = body.get(name)
        if v is None:
            continue
        if not _is_int(v) or v < 1 or v > INT32_MAX:
            raise invalid(f"'{name}' must be a positive integer (at most {INT32_MAX})", name)
        max_tokens = v if max_tokens is None else min(max_tokens, v)
    user = body.get("user")
    if user is not None and not isinstance(user, str):
        raise invalid("'user' must be a string", "user")
    if user is not None and has_control(user):
        raise invalid(f"'user' {CONTROL_MESSAGE}", "user")
    n = body.get("n", 1)
    if n is None:
        n = 1
    if not _is_int(n) or n < 1 or n > 128:
        raise invalid("'n' must be an integer between 1 and 128", "n")
    check_sampling(body, CHAT if endpoint == "chat/completions" else COMPLETIONS)
    return ParsedRequest(
        body=body,
        model=model,
        stream=stream,
        include_usage=include_usage,
        user=user or None,
        max_tokens=max_tokens,
        prompt_chars=chars,
        n=n,
    )


def estimate_tokens(req: ParsedRequest, *, default_max_tokens: int, chars_per_token: float) -> int:
    """Tokens reserved at admission: prompt estimate (chars / chars_per_token) + n × max_tokens."""
    prompt = int(req.prompt_chars / chars_per_token) + 1
    completion = req.max_tokens if req.max_tokens is not None else default_max_tokens
    return prompt + req.n * completion
