"""vLLM's automatic prefix cache, per ``lora_name``, for the simulated engine.

vLLM caches the KV blocks of computed prompts (``block_tokens`` tokens each, hashed with the
previous block's hash and the request's LoRA, so two adapters never share a block) and keeps
freed blocks in an LRU until the memory is needed (``vllm/v1/core/kv_cache_utils.py``,
``block_pool.py``). A new request reuses the longest run of leading blocks found there and
prefills only the rest: on a hit the engine's prefill step is shorter.

The simulator models that with a ``PrefixCache`` of ``capacity_blocks`` blocks: ``lookup`` the
request's chained block hashes (leading run found, refreshed as most recently used), ``insert``
them (evicting the least recently used beyond capacity). It counts the tokens queried and hit,
which the simulator reports as ``vllm:prefix_cache_queries`` / ``vllm:prefix_cache_hits``.

``prompt_blocks`` turns a prompt text into chained block hashes seeded with the served name (a
block is ``block_tokens`` × 4 characters — the simulator's tokens are four characters).
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Sequence

CHARS_PER_TOKEN = 4


def prompt_blocks(seed: str, text: str, block_tokens: int = 16) -> list[int]:
    """Chained hashes of the full blocks of ``text``, the first seeded with ``seed`` (the LoRA)."""
    size = block_tokens * CHARS_PER_TOKEN
    out: list[int] = []
    prev = hashlib.blake2b(seed.encode(), digest_size=8).digest()
    for i in range(len(text) // size):
        prev = hashlib.blake2b(prev + text[i * size : (i + 1) * size].encode(), digest_size=8).digest()
        out.append(int.from_bytes(prev, "big"))
    return out


class PrefixCache:
    def __init__(self, capacity_blocks: int, block_tokens: int = 16) -> None:
        if capacity_blocks < 1 or block_tokens < 1:
            raise ValueError("capacity_blocks and block_tokens must be >= 1")
        self.capacity = capacity_blocks
        self.block_tokens = block_tokens
        self._blocks: OrderedDict[int, None] = OrderedDict()
        self.queried_tokens = 0
        self.hit_tokens = 0

    def __len__(self) -> int:
        return len(self._blocks)

    def lookup(self, blocks: Sequence[int], prompt_tokens: int) -> int:
        """Cached prompt tokens for a request of ``prompt_tokens`` whose blocks are ``blocks``
        (at most ``prompt_tokens - 1``: vLLM always computes the last token)."""
        cache = self._blocks
        n = 0
        for h in blocks:
            if h not in cache:
                break
            cache.move_to_end(h)
            n += 1
        cached = min(n * self.block_tokens, max(0, prompt_tokens - 1))
        self.queried_tokens += prompt_tokens
        self.hit_tokens += cached
        return cached

    def insert(self, blocks: Sequence[int]) -> None:
        cache = self._blocks
        for h in blocks:
            cache[h] = None
            cache.move_to_end(h)
        while len(cache) > self.capacity:
            cache.popitem(last=False)
