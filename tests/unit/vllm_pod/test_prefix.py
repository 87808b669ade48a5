"""Prefix cache: whole blocks, per adapter, bounded by capacity (as vLLM 0.32.0 counts hits)."""

from __future__ import annotations

import pytest

from epp.tools.sim.kvcache import PrefixCache


def words(n: int, salt: str = "w") -> list[str]:
    return [f"{salt}{i}" for i in range(n)]


@pytest.mark.parametrize(
    ("prompt_len", "block_size", "hit_tokens"),
    [
        (480, 128, 384),  # the measured case: 3 of 480 tokens' blocks
        (512, 128, 384),  # exactly 4 blocks: the last token is always computed
        (100, 128, 0),  # shorter than a block never hits
        (33, 16, 32),
    ],
    ids=["measured-480", "exact-multiple", "sub-block", "small-blocks"],
)
def test_second_identical_prompt_hits_whole_blocks(prompt_len: int, block_size: int, hit_tokens: int) -> None:
    cache = PrefixCache(block_size=block_size, capacity_blocks=1000)
    prompt = words(prompt_len)
    assert cache.lookup(None, prompt) == 0
    cache.insert(None, prompt)
    assert cache.lookup(None, prompt) == hit_tokens


@pytest.mark.parametrize(
    ("first", "second"),
    [(None, "lora-0"), ("lora-0", None), ("lora-0", "lora-1")],
    ids=["base-then-adapter", "adapter-then-base", "adapter-then-other-adapter"],
)
def test_prefix_cache_is_per_adapter(first: str | None, second: str | None) -> None:
    cache = PrefixCache(block_size=16, capacity_blocks=100)
    prompt = words(64)
    cache.insert(first, prompt)
    assert cache.lookup(second, prompt) == 0
    assert cache.lookup(first, prompt) == 48


def test_shared_prefix_hits_only_up_to_divergence() -> None:
    cache = PrefixCache(block_size=4, capacity_blocks=100)
    cache.insert(None, words(16))
    assert cache.lookup(None, [*words(9), "different", *words(6, "x")]) == 8


def test_capacity_evicts_least_recently_used_blocks() -> None:
    cache = PrefixCache(block_size=4, capacity_blocks=4)
    old, new = words(8, "old"), words(8, "new")
    cache.insert(None, old)  # 2 blocks
    cache.insert(None, new)  # 2 blocks: full
    assert cache.lookup(None, [*old, "t"]) == 8  # touching old makes new the LRU
    cache.insert("a", words(8, "third"))  # 2 more blocks evict new's
    assert len(cache) == 4
    assert cache.lookup(None, [*new, "t"]) == 0
    assert cache.lookup(None, [*old, "t"]) == 8
