"""Prefix cache: whole blocks, per adapter, bounded by free KV (as vLLM 0.32.0 counts hits)."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from epp.tools.vllm_pod.prefix import PrefixCache, shared_prefix_segments, token_segments


def words(n: int, salt: str = "w") -> list[str]:
    return [f"{salt}{i}" for i in range(n)]


def lookup(cache: PrefixCache, adapter: str, prompt: Sequence[str], block_size: int) -> int:
    return cache.lookup(adapter, *token_segments(prompt, block_size))


def insert(cache: PrefixCache, adapter: str, prompt: Sequence[str], block_size: int) -> None:
    cache.insert(adapter, token_segments(prompt, block_size)[0])


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
    cache = PrefixCache()
    prompt = words(prompt_len)
    assert lookup(cache, "", prompt, block_size) == 0
    insert(cache, "", prompt, block_size)
    assert lookup(cache, "", prompt, block_size) == hit_tokens


@pytest.mark.parametrize(
    ("first", "second"),
    [("", "lora-0"), ("lora-0", ""), ("lora-0", "lora-1")],
    ids=["base-then-adapter", "adapter-then-base", "adapter-then-other-adapter"],
)
def test_prefix_cache_is_per_adapter(first: str, second: str) -> None:
    cache = PrefixCache()
    prompt = words(64)
    insert(cache, first, prompt, 16)
    assert lookup(cache, second, prompt, 16) == 0
    assert lookup(cache, first, prompt, 16) == 48


def test_shared_prefix_hits_only_up_to_divergence() -> None:
    cache = PrefixCache()
    insert(cache, "", words(16), 4)
    assert lookup(cache, "", [*words(9), "different", *words(6, "x")], 4) == 8


def test_trimming_to_free_kv_evicts_least_recently_used_blocks() -> None:
    cache = PrefixCache()
    free_tokens = 16  # room for 4 blocks of 4
    old, new = words(8, "old"), words(8, "new")
    insert(cache, "", old, 4)  # 2 blocks
    insert(cache, "", new, 4)  # 2 blocks: full
    cache.trim(free_tokens)
    assert lookup(cache, "", [*old, "t"], 4) == 8  # touching old makes new the LRU
    insert(cache, "a", words(8, "third"), 4)  # 2 more blocks evict new's
    cache.trim(free_tokens)
    assert len(cache) == 4 and cache.tokens == 16
    assert lookup(cache, "", [*new, "t"], 4) == 0
    assert lookup(cache, "", [*old, "t"], 4) == 8


def test_a_named_shared_prefix_hits_whole_and_only_on_its_adapter() -> None:
    cache = PrefixCache()
    cache.insert("a", shared_prefix_segments("system", 512))
    assert cache.lookup("a", shared_prefix_segments("system", 512), 1) == 512
    assert cache.lookup("b", shared_prefix_segments("system", 512), 1) == 0
    assert shared_prefix_segments("", 512) == shared_prefix_segments("system", 0) == ()
