"""The router's prefix index (``router/prefix.py``): keyed by adapter, longest prefix, bounded,
decaying; session affinity as its special case."""

from __future__ import annotations

import pytest

from router.prefix import PrefixIndex, block_hashes, prompt_text, served_seed

SYSTEM = "You are a careful assistant for the accounts team. " * 20  # ~1,000 characters


def test_prompt_text_reads_chat_and_completions_bodies() -> None:
    chat = {
        "messages": [
            {"role": "system", "content": "sys"},
            {"role": "user", "content": [{"type": "text", "text": "hi"}]},
        ]
    }
    assert prompt_text(chat) == "system\nsys\nuser\nhi"
    assert prompt_text({"prompt": "once upon"}) == "once upon"
    assert prompt_text({"prompt": ["a", "b"]}) == "a\nb"
    assert prompt_text({"prompt": 5}) == "" and prompt_text({"messages": ["x", 3]}) == "\n".join([])


def test_blocks_are_chained_and_seeded_with_the_served_name() -> None:
    a = block_hashes("a@v1-00000001", SYSTEM, 64)
    b = block_hashes("b@v1-00000002", SYSTEM, 64)
    assert len(a) == len(SYSTEM) // 64 and not set(a) & set(b)  # another adapter: no common block
    longer = block_hashes("a@v1-00000001", SYSTEM + "more text " * 20, 64)
    assert longer[: len(a)] == a  # a shared prefix hashes the same
    changed = block_hashes("a@v1-00000001", "X" + SYSTEM[1:], 64)
    assert not set(changed) & set(a)  # chained: a change in block 0 changes every later block
    assert served_seed(None, "base-m") == "base:base-m" and served_seed("a", "base-m") == "a"


def test_match_gives_each_replicas_longest_cached_prefix_in_tokens() -> None:
    ix = PrefixIndex(block_chars=64)
    seed = "a@v1-00000001"
    turn1 = SYSTEM + "user: what is my balance?"
    turn2 = turn1 + " assistant: 42. user: and yesterday?" * 3
    ix.record(ix.hashes(seed, SYSTEM), "r0", 1.0)
    ix.record(ix.hashes(seed, turn1), "r1", 2.0)
    got = ix.match(ix.hashes(seed, turn2), 3.0)
    assert got["r1"] > got["r0"] > 0
    assert got["r0"] == (len(SYSTEM) // 64) * 16
    assert ix.match(ix.hashes("b@v1-00000002", turn2), 3.0) == {}  # keyed by adapter
    # session affinity: the replica that served the last turn holds the longest prefix
    ix.record(ix.hashes(seed, turn2), "r1", 4.0)
    turn3 = turn2 + " assistant: 40. user: thanks" * 2
    best = ix.match(ix.hashes(seed, turn3), 5.0)
    assert max(best, key=best.__getitem__) == "r1"


def test_entries_decay_after_ttl_and_memory_is_bounded() -> None:
    ix = PrefixIndex(block_chars=64, capacity=100, ttl_s=60.0, per_block=2)
    seed = "a@v1-00000001"
    h = ix.hashes(seed, SYSTEM)
    ix.record(h, "r0", 0.0)
    assert ix.match(h, 59.0) and not ix.match(h, 61.0)
    for i in range(50):
        ix.record(ix.hashes(seed, f"{i} " + SYSTEM), "r0", 100.0)
    assert len(ix) <= 100
    ix.record(h, "r1", 101.0)
    ix.record(h, "r2", 102.0)
    ix.record(h, "r3", 103.0)
    assert set(ix.match(h, 104.0)) == {"r2", "r3"}  # at most per_block replicas a block
    ix.forget("r3")
    assert set(ix.match(h, 104.0)) == {"r2"}
    with pytest.raises(ValueError):
        PrefixIndex(ttl_s=0)
