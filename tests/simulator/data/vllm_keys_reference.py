"""Regenerate ``vllm-0.32-keys.json``: the key sets of vLLM's chat and completions bodies and chunks.

Run with the interpreter of an environment that has vLLM installed (the engine tier's venv), not
the project's own::

    ~/.cache/loraplane/engine/vllm-venv/bin/python tests/simulator/data/vllm_keys_reference.py \\
        > tests/simulator/data/vllm-0.32-keys.json

It builds each response with vLLM's own pydantic models, the way vLLM 0.32's serving code does
(``entrypoints/openai/chat_completion/serving.py``, ``…/completion/serving.py``: same
constructor arguments, same assignments, same ``model_dump`` / ``model_dump_json`` options) for
a server without a reasoning or tool parser and without ``--enable-prompt-tokens-details``, and
prints, per body or chunk kind, the keys at every path (list items as ``path[]``).
``tests/simulator/test_sim_behaviours_config.py`` checks that the conformance script's
reference (``simulator/conformance_keys.py``) equals this file.
"""

from __future__ import annotations

import json
from typing import Any

from vllm.entrypoints.generate.base.protocol import DeltaMessage
from vllm.entrypoints.openai.chat_completion.protocol import (
    ChatCompletionResponse,
    ChatCompletionResponseChoice,
    ChatCompletionResponseStreamChoice,
    ChatCompletionStreamResponse,
    ChatMessage,
)
from vllm.entrypoints.openai.completion.protocol import (
    CompletionResponse,
    CompletionResponseChoice,
    CompletionResponseStreamChoice,
    CompletionStreamResponse,
)
from vllm.entrypoints.serve.engine.protocol import ErrorInfo, ErrorResponse, UsageInfo

FP = "vllm-0.32.0-00000000"


def paths(obj: Any, path: str = "", out: dict[str, list[str]] | None = None) -> dict[str, list[str]]:
    out = {} if out is None else out
    if isinstance(obj, dict):
        out[path] = sorted(obj)
        for k, v in obj.items():
            paths(v, f"{path}.{k}" if path else k, out)
    elif isinstance(obj, list):
        for item in obj:
            paths(item, f"{path}[]", out)
    return out


def chat_chunks(include_usage: bool, continuous: bool) -> dict[str, Any]:
    head = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "m"}
    out: dict[str, Any] = {}
    role = ChatCompletionStreamResponse(
        **head,
        choices=[
            ChatCompletionResponseStreamChoice(
                index=0, delta=DeltaMessage(role="assistant", content=""), logprobs=None, finish_reason=None
            )
        ],
        prompt_token_ids=None,
        prompt_text=None,
    )
    if continuous:
        role.usage = UsageInfo(
            prompt_tokens=3, completion_tokens=0, total_tokens=3, completion_tokens_details=None
        )
    out["role"] = json.loads(role.model_dump_json(exclude_unset=True))
    for kind, finish in (("content", None), ("finish", "length")):
        extra: dict[str, Any] = {"stop_reason": None} if finish else {}
        choice = ChatCompletionResponseStreamChoice(
            index=0,
            delta=DeltaMessage(content="x"),
            logprobs=None,
            finish_reason=finish,
            token_ids=None,
            **extra,
        )
        chunk = ChatCompletionStreamResponse(**head, choices=[choice])
        if not include_usage and finish is not None:
            chunk.system_fingerprint = FP
        if continuous:
            chunk.usage = UsageInfo(
                prompt_tokens=3, completion_tokens=1, total_tokens=4, completion_tokens_details=None
            )
        out[kind] = json.loads(chunk.model_dump_json(exclude_unset=True))
    if include_usage:
        usage = UsageInfo(
            prompt_tokens=3, completion_tokens=1, total_tokens=4, completion_tokens_details=None
        )
        usage.prompt_tokens_details = None
        last = ChatCompletionStreamResponse(
            **head, choices=[], usage=usage, system_fingerprint=FP, metrics=None
        )
        out["usage"] = json.loads(last.model_dump_json(exclude_unset=True, exclude_none=True))
    return out


def completion_chunks(include_usage: bool, continuous: bool) -> dict[str, Any]:
    head = {"id": "cmpl-1", "object": "text_completion", "created": 1, "model": "m"}
    out: dict[str, Any] = {}
    for kind, finish in (("content", None), ("finish", "length")):
        choice = CompletionResponseStreamChoice(
            index=0,
            text="x",
            logprobs=None,
            finish_reason=finish,
            stop_reason=None,
            prompt_token_ids=None,
            token_ids=None,
        )
        chunk = CompletionStreamResponse(**head, choices=[choice])
        if not include_usage and finish is not None:
            chunk.system_fingerprint = FP
        if continuous:
            chunk.usage = UsageInfo(prompt_tokens=3, completion_tokens=1, total_tokens=4)
        out[kind] = json.loads(chunk.model_dump_json(exclude_unset=True))
    if include_usage:
        last = CompletionStreamResponse(
            id="cmpl-1",
            created=1,
            model="m",
            choices=[],
            usage=UsageInfo(prompt_tokens=3, completion_tokens=1, total_tokens=4),
            system_fingerprint=FP,
            metrics=None,
        )
        out["usage"] = json.loads(last.model_dump_json(exclude_unset=False, exclude_none=True))
    return out


def main() -> None:
    usage = UsageInfo(prompt_tokens=3, completion_tokens=1, total_tokens=4, completion_tokens_details=None)
    usage.prompt_tokens_details = None
    chat = ChatCompletionResponse(
        id="chatcmpl-1",
        created=1,
        model="m",
        choices=[
            ChatCompletionResponseChoice(
                index=0,
                message=ChatMessage(role="assistant", reasoning=None, content="x"),
                logprobs=None,
                finish_reason="length",
                stop_reason=None,
                token_ids=None,
                routed_experts=None,
            )
        ],
        usage=usage,
        system_fingerprint=FP,
        prompt_logprobs=None,
        prompt_token_ids=None,
        prompt_text=None,
        kv_transfer_params=None,
        ec_transfer_params=None,
        metrics=None,
    )
    completion = CompletionResponse(
        id="cmpl-1",
        created=1,
        model="m",
        choices=[
            CompletionResponseChoice(
                index=0,
                text="x",
                logprobs=None,
                finish_reason="length",
                stop_reason=None,
                prompt_logprobs=None,
                prompt_token_ids=None,
                token_ids=None,
                routed_experts=None,
            )
        ],
        usage=UsageInfo(prompt_tokens=3, completion_tokens=1, total_tokens=4),
        system_fingerprint=FP,
        kv_transfer_params=None,
        ec_transfer_params=None,
        metrics=None,
    )
    ref: dict[str, Any] = {
        "chat": paths(chat.model_dump()),
        "completion": paths(completion.model_dump()),
        "error": paths(
            ErrorResponse(error=ErrorInfo(message="m", type="E", param=None, code=404)).model_dump()
        ),
    }
    variants = (("plain", (False, False)), ("include_usage", (True, False)), ("continuous", (True, True)))
    for label, opts in variants:
        for name, chunks in (("chat", chat_chunks(*opts)), ("completion", completion_chunks(*opts))):
            ref[f"{name}_stream_{label}"] = {kind: paths(obj) for kind, obj in chunks.items()}
    print(json.dumps(ref, indent=1, sort_keys=True))


if __name__ == "__main__":
    main()
