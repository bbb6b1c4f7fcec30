"""Deterministic tokenizer and text generator of the simulator.

- Tokens are regex words or single punctuation characters (``count_tokens``).
- Generated text depends only on (identity, prompt, seed, choice index): ``identity`` is the
  served adapter's weights sha256, or ``base:<name>`` for the base model. Each generated token
  is one word from a fixed vocabulary, written with a leading space, so re-tokenizing the
  output gives exactly ``completion_tokens`` tokens.
"""

from __future__ import annotations

import hashlib
import random
import re
import zlib
from dataclasses import dataclass
from functools import lru_cache

_TOKEN_RE = re.compile(r"\w+|[^\w\s]")

_WORDS = [
    "the",
    "of",
    "and",
    "to",
    "in",
    "is",
    "was",
    "for",
    "on",
    "that",
    "with",
    "as",
    "by",
    "at",
    "from",
    "it",
    "an",
    "be",
    "this",
    "which",
    "or",
    "are",
    "were",
    "has",
    "have",
    "had",
    "not",
    "but",
    "all",
    "can",
    "one",
    "their",
    "more",
    "new",
    "its",
    "also",
    "been",
    "other",
    "after",
    "first",
    "two",
    "than",
    "into",
    "some",
    "time",
    "would",
    "only",
    "most",
    "over",
    "these",
    "such",
    "when",
    "many",
    "about",
    "up",
    "out",
    "them",
    "may",
    "then",
    "where",
    "so",
    "its",
    "between",
    "both",
    "under",
    "year",
    "used",
    "any",
    "system",
    "model",
    "data",
    "light",
    "river",
    "stone",
    "cloud",
    "signal",
    "garden",
    "window",
    "market",
    "engine",
    "field",
    "forest",
    "paper",
    "table",
    "ocean",
    "number",
    "letter",
    "answer",
    "memory",
    "circle",
    "bridge",
    "rocket",
    "winter",
    "summer",
    "planet",
    "silver",
    "copper",
    "orange",
    "purple",
    "quiet",
    "rapid",
    "gentle",
    "bright",
    "simple",
    "golden",
    "hidden",
    "broken",
    "frozen",
    "ancient",
    "modern",
    "hollow",
    "steady",
    "narrow",
    "compute",
    "route",
    "adapter",
    "replica",
    "token",
    "stream",
    "vector",
    "tensor",
    "matrix",
    "kernel",
    "layer",
    "weight",
    "cache",
    "batch",
    "queue",
    "north",
    "south",
    "east",
    "west",
    "morning",
    "evening",
    "city",
    "valley",
    "harbor",
    "island",
    "canyon",
    "meadow",
    "desert",
    "glacier",
    "volcano",
]
VOCAB: tuple[str, ...] = tuple(dict.fromkeys(_WORDS))


def tokenize(text: str) -> list[str]:
    return _TOKEN_RE.findall(text)


def count_tokens(text: str) -> int:
    return len(_TOKEN_RE.findall(text))


def token_ids(text: str) -> list[int]:
    """Stable fake ids in ``[0, 32000)`` for ``/tokenize``."""
    return [zlib.crc32(t.encode()) % 32000 for t in _TOKEN_RE.findall(text)]


def render_chat(messages: list[dict[str, object]]) -> str:
    """A tiny chat template: ``<|role|>\\ncontent\\n`` per message plus the assistant header."""
    parts = []
    for m in messages:
        content = m.get("content")
        if isinstance(content, list):
            content = " ".join(
                str(p.get("text", "")) for p in content if isinstance(p, dict) and p.get("type") == "text"
            )
        parts.append(f"<|{m.get('role', 'user')}|>\n{content if content is not None else ''}\n")
    parts.append("<|assistant|>\n")
    return "".join(parts)


@lru_cache(maxsize=4096)
def _words(identity: str, prompt: str, seed: int, index: int, n: int) -> tuple[str, ...]:
    digest = hashlib.blake2b(f"{identity}\x00{seed}\x00{index}\x00{prompt}".encode(), digest_size=8).digest()
    rng = random.Random(int.from_bytes(digest, "little"))
    return tuple(" " + w for w in rng.choices(VOCAB, k=n))


@dataclass(frozen=True, slots=True)
class Generation:
    pieces: tuple[str, ...]  # one text piece per generated token (the last may be cut by a stop)
    finish_reason: str  # "length" | "stop"
    stop_reason: str | None

    @property
    def text(self) -> str:
        return "".join(self.pieces)

    @property
    def num_tokens(self) -> int:
        return len(self.pieces)


def generate(
    identity: str,
    prompt: str,
    *,
    max_tokens: int,
    seed: int = 0,
    index: int = 0,
    stop: list[str] | None = None,
) -> Generation:
    """Deterministic output of ``max_tokens`` words, cut at the first ``stop`` string."""
    words = _words(identity, prompt, seed, index, max_tokens)
    if stop:
        text = ""
        for i, w in enumerate(words):
            before = len(text)
            text += w
            hits = [(text.find(s, max(0, before - len(s) + 1)), s) for s in stop if s]
            hits = [(pos, s) for pos, s in hits if pos >= 0]
            if hits:
                pos, s = min(hits)
                pieces = list(words[:i])
                cut = pos - before
                if cut > 0:
                    pieces.append(w[:cut])
                elif cut < 0:  # the stop string began in an earlier piece
                    joined = "".join(pieces)[:pos]
                    pieces = [joined] if joined else []
                return Generation(_pad(pieces, i + 1), "stop", s)
    return Generation(words, "length", None)


def _pad(pieces: list[str], n_tokens: int) -> tuple[str, ...]:
    """Keep ``n_tokens`` generated tokens (the stop token's text is dropped, as in vLLM)."""
    out = list(pieces)
    while len(out) < n_tokens:
        out.append("")
    return tuple(out[:n_tokens]) if len(out) > n_tokens else tuple(out)
