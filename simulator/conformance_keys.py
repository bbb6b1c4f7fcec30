"""Key-set checks of ``simulator.conformance``: every response body and every stream chunk of chat
and completions must carry exactly the keys real vLLM 0.32 sends, recursively.

The reference below was read from vLLM 0.32.0's pydantic models and serving code
(``entrypoints/openai/chat_completion``, ``…/completion``, ``generate/base/protocol.py``):

- Whole bodies are ``model_dump()``: every field, nulls included, except that ``ChatMessage``
  and ``DeltaMessage`` drop an empty ``tool_calls`` list. Without a reasoning parser and without
  ``--enable-prompt-tokens-details`` both usage details are null.
- Stream chunks are ``model_dump_json(exclude_unset=True)``: only the fields the server set,
  explicit nulls included. The terminal chunk of each choice gets ``system_fingerprint`` when
  no usage chunk follows; the usage chunk (``include_usage``) also drops nulls.
  ``continuous_usage_stats`` puts ``usage`` on every chunk: chat's holds
  ``completion_tokens_details`` (set to null), completions' does not.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import httpx

from simulator.conformance_checks import Runner

__all__ = ["CHAT_BODY", "COMPLETION_BODY", "ERROR_BODY", "key_diffs", "keysets", "stream_reference"]

Keys = frozenset[str]
KeySets = Mapping[str, Keys]

_HEAD = frozenset({"id", "object", "created", "model", "choices"})
USAGE_BARE = frozenset({"prompt_tokens", "total_tokens", "completion_tokens"})
USAGE_FULL = USAGE_BARE | {"prompt_tokens_details", "completion_tokens_details"}
ERROR_BODY: KeySets = {"": frozenset({"error"}), "error": frozenset({"message", "type", "param", "code"})}

CHAT_BODY: KeySets = {
    "": _HEAD
    | {
        "service_tier",
        "system_fingerprint",
        "usage",
        "prompt_logprobs",
        "prompt_token_ids",
        "prompt_text",
        "kv_transfer_params",
        "ec_transfer_params",
        "metrics",
    },
    "choices[]": frozenset(
        {"index", "message", "logprobs", "finish_reason", "stop_reason", "token_ids", "routed_experts"}
    ),
    "choices[].message": frozenset(
        {"role", "content", "refusal", "annotations", "audio", "function_call", "reasoning"}
    ),
    "usage": USAGE_FULL,
}
COMPLETION_BODY: KeySets = {
    "": _HEAD
    | {"service_tier", "system_fingerprint", "usage", "kv_transfer_params", "ec_transfer_params", "metrics"},
    "choices[]": frozenset(
        {
            "index",
            "text",
            "logprobs",
            "finish_reason",
            "stop_reason",
            "token_ids",
            "prompt_logprobs",
            "prompt_token_ids",
            "routed_experts",
        }
    ),
    "usage": USAGE_FULL,
}


def stream_reference(chat: bool, include_usage: bool, continuous: bool) -> dict[str, dict[str, Keys]]:
    """Expected key sets per chunk kind (``role``, ``content``, ``finish``, ``usage``)."""
    usage_keys = (USAGE_BARE | {"completion_tokens_details"}) if chat else USAGE_BARE
    extra = frozenset({"usage"}) if continuous else frozenset()
    fingerprint = frozenset() if include_usage else frozenset({"system_fingerprint"})
    ref: dict[str, dict[str, Keys]] = {}
    if chat:
        ref["role"] = {
            "": _HEAD | {"prompt_token_ids", "prompt_text"} | extra,
            "choices[]": frozenset({"index", "delta", "logprobs", "finish_reason"}),
            "choices[].delta": frozenset({"role", "content"}),
        }
        ref["content"] = {
            "": _HEAD | extra,
            "choices[]": frozenset({"index", "delta", "logprobs", "finish_reason", "token_ids"}),
            "choices[].delta": frozenset({"content"}),
        }
        ref["finish"] = {
            "": _HEAD | extra | fingerprint,
            "choices[]": frozenset(
                {"index", "delta", "logprobs", "finish_reason", "stop_reason", "token_ids"}
            ),
            "choices[].delta": frozenset({"content"}),
        }
    else:
        choice = frozenset(
            {"index", "text", "logprobs", "finish_reason", "stop_reason", "prompt_token_ids", "token_ids"}
        )
        ref["content"] = {"": _HEAD | extra, "choices[]": choice}
        ref["finish"] = {"": _HEAD | extra | fingerprint, "choices[]": choice}
    if continuous:
        for kind in ref.values():
            kind["usage"] = usage_keys
    if include_usage:
        ref["usage"] = {"": _HEAD | {"usage", "system_fingerprint"}, "usage": USAGE_BARE}
    return ref


def key_diffs(obj: Any, expected: KeySets, path: str = "") -> list[str]:
    """Differences between the key sets of ``obj`` (recursively) and ``expected`` (path → keys;
    list items are ``path[]``). An object at a path the reference does not know is a difference."""
    out: list[str] = []
    if isinstance(obj, dict):
        want = expected.get(path)
        if want is None:
            return [f"{path or '<top>'}: an object vLLM does not send here (keys {sorted(obj)})"]
        have = set(obj)
        if have != want:
            missing, extra = sorted(want - have), sorted(have - want)
            out.append(f"{path or '<top>'}: missing {missing}, extra {extra}")
        for k, v in obj.items():
            out += key_diffs(v, expected, f"{path}.{k}" if path else k)
    elif isinstance(obj, list):
        for item in obj:
            out += key_diffs(item, expected, f"{path}[]")
    return out


def _chunk_kind(chunk: dict[str, Any], chat: bool) -> str:
    choices = chunk.get("choices") or []
    if not choices:
        return "usage"
    first = choices[0]
    if chat and "role" in (first.get("delta") or {}):
        return "role"
    return "finish" if first.get("finish_reason") is not None else "content"


def _stream_diffs(r: httpx.Response, chat: bool, include_usage: bool, continuous: bool) -> tuple[bool, str]:
    ref = stream_reference(chat, include_usage, continuous)
    events = [b for b in r.text.split("\n\n") if b.strip() and not b.startswith(":")]
    if r.status_code != 200 or not events or events[-1] != "data: [DONE]":
        return False, f"{r.status_code} {r.text[:300]}"
    seen: dict[str, int] = {}
    problems: list[str] = []
    for raw in events[:-1]:
        chunk = json.loads(raw.removeprefix("data: "))
        if "error" in chunk:
            return False, f"in-band error: {raw[:300]}"
        kind = _chunk_kind(chunk, chat)
        seen[kind] = seen.get(kind, 0) + 1
        problems += [f"{kind} chunk {d}" for d in key_diffs(chunk, ref.get(kind, {}))]
    absent = sorted(set(ref) - set(seen))
    if absent:
        problems.append(f"no {absent} chunk(s) (saw {seen})")
    return not problems, "; ".join(dict.fromkeys(problems))[:600] or str(seen)


def keysets(run: Runner, c: httpx.Client, model: str, name: str) -> None:
    """Checks for chat and completions, whole and
    streamed with each ``stream_options`` variant, and the error envelope."""
    prompt = "Hello there, how are you today"
    messages = [{"role": "user", "content": prompt}]

    def body(chat: bool) -> tuple[bool, str]:
        path = "/v1/chat/completions" if chat else "/v1/completions"
        req: dict[str, Any] = {"model": name, "max_tokens": 4, "ignore_eos": True}
        req.update({"messages": messages} if chat else {"prompt": prompt})
        r = c.post(path, json=req)
        if r.status_code != 200:
            return False, f"{r.status_code} {r.text[:300]}"
        diffs = key_diffs(r.json(), CHAT_BODY if chat else COMPLETION_BODY)
        return not diffs, "; ".join(diffs) or "same keys"

    run.check("keys: chat body has vLLM 0.32's keys at every level", lambda: body(True))
    run.check("keys: completions body has vLLM 0.32's keys at every level", lambda: body(False))

    for chat in (True, False):
        for label, opts in (
            ("no stream_options", None),
            ("include_usage", {"include_usage": True}),
            ("continuous_usage_stats", {"include_usage": True, "continuous_usage_stats": True}),
        ):

            def stream(chat: bool = chat, opts: dict[str, bool] | None = opts) -> tuple[bool, str]:
                path = "/v1/chat/completions" if chat else "/v1/completions"
                req: dict[str, Any] = {"model": name, "max_tokens": 3, "ignore_eos": True, "stream": True}
                req.update({"messages": messages} if chat else {"prompt": prompt})
                if opts is not None:
                    req["stream_options"] = opts
                r = c.post(path, json=req)
                inc = bool(opts and opts.get("include_usage"))
                cont = bool(opts and opts.get("continuous_usage_stats"))
                return _stream_diffs(r, chat, inc, cont)

            kind = "chat" if chat else "completions"
            run.check(f"keys: {kind} stream chunks ({label}) have vLLM 0.32's keys", stream)

    def error() -> tuple[bool, str]:
        r = c.post("/v1/completions", json={"model": f"{model}-nosuch-keys", "prompt": prompt})
        diffs = key_diffs(r.json(), ERROR_BODY)
        return r.status_code == 404 and not diffs, f"{r.status_code} {'; '.join(diffs)}"

    run.check("keys: an error body is exactly {error: {message, type, param, code}}", error)
