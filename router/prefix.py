"""Prefix-aware routing keyed by adapter: which replicas recently computed a prompt's prefix.

vLLM keeps a prefix cache of KV blocks and keys it by ``lora_name`` (two adapters never share
blocks). The router cannot see it, so — like GIE's and llm-d's approximate prefix scorer — it
remembers where it sent each prompt: the prompt text is cut into blocks of ``block_chars``
characters (about ``block_chars / 4`` tokens), each block's hash chained with the previous one's
and the first seeded with the served name (the adapter version's ``lora_name``, or the base
model's), so a hash names "this adapter, this exact prefix". ``record`` notes the replica for
every block of a routed prompt; ``match`` gives, per replica, how many leading blocks of a new
prompt it holds — the longest cached prefix — as prompt tokens.

Bounded and decaying: at most ``capacity`` block hashes are remembered (least recently used
dropped first), each with at most ``per_block`` replicas, and an entry older than ``ttl_s`` no
longer counts (vLLM's cache is an LRU over its KV blocks too; the index is an estimate of it).
At most ``max_blocks`` leading blocks of a prompt are hashed.

Session affinity is the special case of a multi-turn conversation: each turn's prompt starts
with the whole previous turn, so the replica that served turn *n* holds the longest prefix of
turn *n + 1* and the default policy's cost model sends it there while the load allows.

The hashes use Python's ``hash``: the index is per gateway process and never shared.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any

CHARS_PER_TOKEN = 4


def prompt_text(body: Mapping[str, Any]) -> str:
    """The prompt of an OpenAI chat or completions body, as the engine sees it (roughly)."""
    messages = body.get("messages")
    if isinstance(messages, list):
        parts: list[str] = []
        for m in messages:
            if not isinstance(m, dict):
                continue
            role = m.get("role")
            content = m.get("content")
            parts.append(str(role) if isinstance(role, str) else "")
            if isinstance(content, str):
                parts.append(content)
            elif isinstance(content, list):
                parts.extend(
                    c["text"] for c in content if isinstance(c, dict) and isinstance(c.get("text"), str)
                )
        return "\n".join(parts)
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list) and all(isinstance(p, str) for p in prompt):
        return "\n".join(prompt)
    return ""


def served_seed(lora_name: str | None, base_model: str) -> str:
    """What vLLM keys a prompt's cache blocks by: the adapter's served name, or the base model."""
    return lora_name if lora_name is not None else f"base:{base_model}"


def block_hashes(seed: str, text: str, block_chars: int = 64, max_blocks: int = 256) -> list[int]:
    """Chained hashes of the full ``block_chars`` blocks of ``text``, the first seeded with ``seed``."""
    out: list[int] = []
    h = hash(seed)
    n = min(len(text) // block_chars, max_blocks)
    for i in range(n):
        h = hash((h, text[i * block_chars : (i + 1) * block_chars]))
        out.append(h)
    return out


class PrefixIndex:
    """(served name, prefix block hash) → replicas that recently computed it (see module doc)."""

    def __init__(
        self,
        *,
        block_chars: int = 64,
        max_blocks: int = 256,
        capacity: int = 200_000,
        per_block: int = 8,
        ttl_s: float = 600.0,
    ) -> None:
        if block_chars < 1 or max_blocks < 1 or capacity < 1 or per_block < 1 or ttl_s <= 0:
            raise ValueError("block_chars, max_blocks, capacity, per_block >= 1 and ttl_s > 0 are required")
        self.block_chars = block_chars
        self.max_blocks = max_blocks
        self.capacity = capacity
        self.per_block = per_block
        self.ttl_s = ttl_s
        self._blocks: OrderedDict[int, dict[str, float]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._blocks)

    def hashes(self, seed: str, text: str) -> list[int]:
        return block_hashes(seed, text, self.block_chars, self.max_blocks)

    def tokens_per_block(self) -> int:
        return max(1, self.block_chars // CHARS_PER_TOKEN)

    def record(self, hashes: Sequence[int], url: str, now: float) -> None:
        """``url`` computed these blocks at ``now``."""
        blocks = self._blocks
        for h in hashes:
            where = blocks.get(h)
            if where is None:
                where = blocks[h] = {}
            else:
                blocks.move_to_end(h)
            where[url] = now
            if len(where) > self.per_block:  # forget the replica that computed it longest ago
                del where[min(where, key=where.__getitem__)]
        while len(blocks) > self.capacity:
            blocks.popitem(last=False)

    def match(self, hashes: Sequence[int], now: float) -> dict[str, int]:
        """Replica url → cached prompt tokens: its longest run of leading blocks (fresh ones)."""
        blocks = self._blocks
        horizon = now - self.ttl_s
        counts: dict[str, int] = {}
        alive: set[str] | None = None
        for i, h in enumerate(hashes):
            where = blocks.get(h)
            if where is None:
                break
            fresh = {u for u, t in where.items() if t >= horizon}
            alive = fresh if alive is None else alive & fresh
            if not alive:
                break
            for u in alive:
                counts[u] = i + 1
        per = self.tokens_per_block()
        return {u: n * per for u, n in counts.items()}

    def forget(self, url: str) -> None:
        """A replica left (or restarted): nothing of its cache survives."""
        for where in self._blocks.values():
            where.pop(url, None)
