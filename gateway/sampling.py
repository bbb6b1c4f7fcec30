"""Types of the sampling parameters of a completion request, checked as OpenAI's API does.

``temperature: "hot"`` is a malformed request: vLLM answers it 400 (its pydantic model), and so
does the gateway, before admission, in OpenAI's error shape (400 ``invalid_request``, ``param``
naming the field, OpenAI's wording ``Invalid type for 'temperature': expected a number, but got
a string instead.``). Only JSON types are checked here; ranges (``temperature`` below 0, a
``top_p`` above 1, …) are the engine's to judge, and its 400 reaches the client as a 400.

The JSON types are OpenAI's: a number is a JSON number (not a numeric string, not a boolean), an
integer a JSON integer, a flag a JSON boolean; ``null`` is always accepted (the default). The
fields are OpenAI's sampling parameters and vLLM's common extras; other fields are the engine's.

Cost: one dict lookup per field of the body (a typical request has four to six), a type test for
the fields found; nothing is parsed twice.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gateway.errors import GatewayError, invalid

_NUMBER = (int, float)


def _number(v: Any) -> bool:
    return type(v) in _NUMBER  # a JSON number; ``bool`` is not (``type(True) is bool``)


def _integer(v: Any) -> bool:
    return type(v) is int


def _boolean(v: Any) -> bool:
    return type(v) is bool


def _stop(v: Any) -> bool:
    return type(v) is str or (type(v) is list and all(type(s) is str for s in v))


def _token_ids(v: Any) -> bool:
    return type(v) is list and all(type(t) is int for t in v)


def _logit_bias(v: Any) -> bool:
    return type(v) is dict and all(type(b) in _NUMBER for b in v.values())


Check = tuple[Callable[[Any], bool], str]  # (test, what the field must be)

NUMBER: Check = (_number, "a number")
INTEGER: Check = (_integer, "an integer")
BOOLEAN: Check = (_boolean, "a boolean")

_COMMON: dict[str, Check] = {
    # OpenAI's
    "temperature": NUMBER,
    "top_p": NUMBER,
    "presence_penalty": NUMBER,
    "frequency_penalty": NUMBER,
    "seed": INTEGER,
    "stop": (_stop, "a string or an array of strings"),
    "logit_bias": (_logit_bias, "an object mapping token ids to numbers"),
    "echo": BOOLEAN,
    # vLLM's sampling extras
    "top_k": INTEGER,
    "min_p": NUMBER,
    "repetition_penalty": NUMBER,
    "length_penalty": NUMBER,
    "min_tokens": INTEGER,
    "ignore_eos": BOOLEAN,
    "stop_token_ids": (_token_ids, "an array of integers"),
    "skip_special_tokens": BOOLEAN,
    "spaces_between_special_tokens": BOOLEAN,
    "include_stop_str_in_output": BOOLEAN,
    "prompt_logprobs": INTEGER,
}
CHAT: dict[str, Check] = {**_COMMON, "logprobs": BOOLEAN, "top_logprobs": INTEGER}
COMPLETIONS: dict[str, Check] = {
    **_COMMON,
    "logprobs": INTEGER,
    "best_of": INTEGER,
    "suffix": (lambda v: type(v) is str, "a string"),
}

_JSON_NAMES = {str: "a string", int: "an integer", float: "a number", bool: "a boolean", list: "an array",
               dict: "an object"}  # fmt: skip


def check_sampling(body: dict[str, Any], checks: dict[str, Check]) -> None:
    """Raise a 400 :class:`GatewayError` for the first field of ``body`` whose JSON type is wrong."""
    for name, value in body.items():
        check = checks.get(name)
        if check is not None and value is not None and not check[0](value):
            raise _wrong_type(name, value, check[1])


def _wrong_type(name: str, value: Any, want: str) -> GatewayError:
    got = _JSON_NAMES.get(type(value), "a value of another type")
    if type(value) in (list, dict) and got in want:  # the right container, a wrong member
        got += " holding a member of another type"
    return invalid(f"Invalid type for '{name}': expected {want}, but got {got} instead.", name)
