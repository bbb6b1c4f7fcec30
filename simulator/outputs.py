"""Answer texts for simulated behaviours: refusals, JSON objects and truncated (broken) JSON.

Each answer is split into one piece per token of the simulator's tokenizer (whitespace rides
with the token after it), so usage counts match the text, and is cut at ``max_tokens`` like a
real model (finish_reason ``length``); a shorter answer ends with ``stop`` (an EOS, no
``stop_reason``). ``stop`` strings are not applied to these answers.
"""

from __future__ import annotations

import json
import re

from simulator.textgen import Generation, generate

__all__ = ["REFUSALS", "json_answer", "pieces_of", "refusal"]

#: The refusal texts (one is picked per choice, deterministically from the request).
REFUSALS = (
    "I can't help with that.",
    "I'm sorry, but I can't assist with that request.",
    "I cannot help with that request.",
)
_PIECE_RE = re.compile(r"\s*(?:\w+|[^\w\s])")
_MAX_ANSWER_WORDS = 24


def pieces_of(text: str) -> tuple[str, ...]:
    """``text`` split into one piece per token (leading whitespace kept with its token)."""
    return tuple(_PIECE_RE.findall(text))


def _fit(pieces: tuple[str, ...], max_tokens: int) -> Generation:
    if len(pieces) >= max_tokens:
        return Generation(pieces[:max_tokens], "length", None)
    return Generation(pieces, "stop", None)


def refusal(pick: float, max_tokens: int) -> Generation:
    """One of ``REFUSALS`` (``pick`` in [0, 1) chooses), cut at ``max_tokens``."""
    return _fit(pieces_of(REFUSALS[int(pick * len(REFUSALS)) % len(REFUSALS)]), max_tokens)


def _json_pieces(words: str) -> tuple[str, ...]:
    return pieces_of(json.dumps({"answer": words}))


def json_answer(
    identity: str, prompt: str, *, max_tokens: int, seed: int, index: int, broken: bool
) -> Generation:
    """``{"answer": "<words>"}`` sized to end before ``max_tokens`` (complete from
    ``max_tokens`` 10 on; below that it is cut like any answer that hits the limit); ``broken``
    cuts it inside the answer string instead, so the object is never closed (invalid JSON)."""
    words = generate(identity, prompt, max_tokens=_MAX_ANSWER_WORDS, seed=seed, index=index).pieces
    n = len(words)
    pieces = _json_pieces("".join(words).strip())
    while n > 1 and len(pieces) >= max_tokens:
        n -= 1
        pieces = _json_pieces("".join(words[:n]).strip())
    if broken:
        # '{', '"', 'answer', '"', ':', ' "', then the answer's words: keep about half of them
        head = 6 + max(1, n // 2)
        return _fit(pieces[:head], max_tokens)
    return _fit(pieces, max_tokens)
