"""Per-adapter prefix cache over fixed-size KV blocks, bounded by the KV capacity (LRU).

Models what vLLM 0.32.0 counts as prefix-cache hits: only whole blocks hit, at least one prompt
token is always computed, and the block-hash chain is seeded with the adapter, so the same prompt
on another adapter (or the base) never hits. Pure: no time, no I/O.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Sequence


def block_hashes(adapter: str | None, tokens: Sequence[str], block_size: int) -> list[bytes]:
    """Chained hashes of each whole block of `tokens`; block i's hash covers blocks 0..i and the adapter."""
    hashes: list[bytes] = []
    parent = hashlib.sha256(("adapter:" + (adapter or "")).encode()).digest()
    for start in range(0, len(tokens) - block_size + 1, block_size):
        digest = hashlib.sha256(parent)
        for token in tokens[start : start + block_size]:
            digest.update(token.encode())
            digest.update(b"\x00")
        parent = digest.digest()
        hashes.append(parent)
    return hashes


class PrefixCache:
    """Cached block hashes, least recently used first, at most `capacity_blocks` of them."""

    def __init__(self, block_size: int, capacity_blocks: int) -> None:
        if block_size < 1 or capacity_blocks < 1:
            raise ValueError("block_size and capacity_blocks must be ≥ 1")
        self.block_size = block_size
        self.capacity_blocks = capacity_blocks
        self._blocks: OrderedDict[bytes, None] = OrderedDict()

    def __len__(self) -> int:
        return len(self._blocks)

    def lookup(self, adapter: str | None, tokens: Sequence[str]) -> int:
        """Number of leading prompt tokens served from cache (a multiple of the block size).

        The last prompt token is always computed, so a prompt of exactly N blocks hits at most N-1.
        """
        usable = max(0, len(tokens) - 1)
        hit_blocks = 0
        for block_hash in block_hashes(adapter, tokens[:usable], self.block_size):
            if block_hash not in self._blocks:
                break
            self._blocks.move_to_end(block_hash)
            hit_blocks += 1
        return hit_blocks * self.block_size

    def insert(self, adapter: str | None, tokens: Sequence[str]) -> None:
        """Record every whole block of a computed prompt, evicting the oldest blocks past capacity."""
        for block_hash in block_hashes(adapter, tokens, self.block_size):
            self._blocks[block_hash] = None
            self._blocks.move_to_end(block_hash)
        while len(self._blocks) > self.capacity_blocks:
            self._blocks.popitem(last=False)
