"""An approximate, adapter-aware index of which endpoint holds which prompt prefix blocks.

The prompt is cut into blocks of `block_size_chars` characters (trailing partial block
ignored, at most `max_blocks`); block i's hash chains block i−1's, and block 0 is seeded
with the target model, so one adapter never matches another adapter's blocks (vLLM's
prefix cache is per adapter). Python's built-in `hash` is used: the index lives in one
process, so per-process hash seeds do not matter.

Memory: each endpoint holds at most its capacity of block hashes (LRU); an evicted block
leaves the reverse index too.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence


def prefix_hashes(model: str, prompt: str, *, block_size_chars: int, max_blocks: int) -> list[int]:
    """Chained block hashes of `prompt` for `model`; [] when the prompt has no full block."""
    n_blocks = min(len(prompt) // block_size_chars, max_blocks)
    hashes: list[int] = []
    previous = hash(model)
    for i in range(n_blocks):
        start = i * block_size_chars
        previous = hash((previous, prompt[start : start + block_size_chars]))
        hashes.append(previous)
    return hashes


class PrefixIndex:
    """Block hash → endpoints, and per endpoint an LRU of block hashes."""

    def __init__(self, *, default_capacity_per_endpoint: int = 31_250) -> None:
        if default_capacity_per_endpoint < 1:
            raise ValueError("default_capacity_per_endpoint must be at least 1")
        self.default_capacity_per_endpoint = default_capacity_per_endpoint
        self._holders: dict[int, set[str]] = {}
        self._lru: dict[str, OrderedDict[int, None]] = {}
        self._capacity: dict[str, int] = {}

    def __len__(self) -> int:
        """Distinct block hashes held anywhere."""
        return len(self._holders)

    def set_capacity(self, endpoint: str, capacity: int) -> None:
        """Size `endpoint`'s LRU (e.g. from vLLM's num_gpu_blocks); shrinking evicts at once."""
        self._capacity[endpoint] = max(1, capacity)
        lru = self._lru.get(endpoint)
        if lru is not None:
            self._evict_over(endpoint, lru)

    def record(self, endpoint: str, hashes: Sequence[int]) -> None:
        """`endpoint` now holds every block in `hashes` (most recent last)."""
        if not hashes:
            return
        lru = self._lru.get(endpoint)
        if lru is None:
            lru = self._lru[endpoint] = OrderedDict()
        for h in hashes:
            if h in lru:
                lru.move_to_end(h)
            else:
                lru[h] = None
                holders = self._holders.get(h)
                if holders is None:
                    self._holders[h] = {endpoint}
                else:
                    holders.add(endpoint)
        self._evict_over(endpoint, lru)

    def match(self, hashes: Sequence[int]) -> dict[str, int]:
        """Endpoint → number of leading blocks it holds (endpoints with no hit are absent)."""
        matched: dict[str, int] = {}
        active: set[str] | None = None
        for depth, h in enumerate(hashes, start=1):
            holders = self._holders.get(h)
            if not holders:
                break
            active = set(holders) if active is None else active & holders
            if not active:
                break
            for endpoint in active:
                matched[endpoint] = depth
        return matched

    def forget(self, keep: Iterable[str]) -> None:
        """Drop the blocks of every endpoint not in `keep`."""
        keep_set = set(keep)
        for endpoint in [e for e in self._lru if e not in keep_set]:
            for h in self._lru.pop(endpoint):
                self._drop_holder(h, endpoint)
            self._capacity.pop(endpoint, None)

    def _evict_over(self, endpoint: str, lru: OrderedDict[int, None]) -> None:
        capacity = self._capacity.get(endpoint, self.default_capacity_per_endpoint)
        while len(lru) > capacity:
            h, _ = lru.popitem(last=False)
            self._drop_holder(h, endpoint)

    def _drop_holder(self, h: int, endpoint: str) -> None:
        holders = self._holders.get(h)
        if holders is not None:
            holders.discard(endpoint)
            if not holders:
                del self._holders[h]
