"""The prefix cache: per adapter, least recently used first, living in the pod's free KV.

A prompt is described by a chain of *segments*, each a cache key and the tokens it stands for.
A lookup walks the chain and stops at the first key not cached for the request's adapter; what
it passed is served from cache. Entries are keyed by (adapter, segment key), as vLLM seeds its
block hashes with the LoRA id: the same prompt on another adapter (or the base) never hits. Two
descriptions share this one cache:

- `token_segments`: a real prompt's whole KV blocks, each keyed by a hash chained over every
  earlier block, as vLLM 0.32.0 hashes blocks. So only whole blocks hit, and the last prompt token
  is always computed (a prompt of exactly N blocks hits at most N − 1).
- `shared_prefix_segments`: a synthetic workload's shared system prompt, one segment keyed by its
  name, hit or missed as a whole; `epp bench` describes prompts this way because it has token
  counts, not tokens.

Cached segments occupy KV that no running request reserved, so the pod trims the cache to its
free KV, oldest first, as vLLM's allocator evicts cached blocks to make room. Pure: no time, no I/O.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Hashable, Sequence

Segment = tuple[Hashable, int]  # (cache key, tokens it covers)


def token_segments(tokens: Sequence[str], block_size: int) -> tuple[tuple[Segment, ...], int]:
    """(one segment per whole block of `tokens`, how many of them a lookup may use)."""
    segments: list[Segment] = []
    parent = b""
    for start in range(0, len(tokens) - block_size + 1, block_size):
        digest = hashlib.sha256(parent)
        for token in tokens[start : start + block_size]:
            digest.update(token.encode())
            digest.update(b"\x00")
        parent = digest.digest()
        segments.append((parent, block_size))
    # The last prompt token is always computed: only blocks wholly before it can hit.
    reusable = max(0, len(tokens) - 1) // block_size
    return tuple(segments), reusable


def shared_prefix_segments(prefix_key: str, prefix_tokens: int) -> tuple[Segment, ...]:
    """One segment for a named shared prefix of `prefix_tokens` tokens (none when either is empty)."""
    if not prefix_key or prefix_tokens <= 0:
        return ()
    return ((prefix_key, prefix_tokens),)


class PrefixCache:
    """Cached (adapter, segment key) entries, least recently used first, and the tokens they hold."""

    def __init__(self) -> None:
        self._entries: OrderedDict[tuple[str, Hashable], int] = OrderedDict()
        self.tokens = 0

    def __len__(self) -> int:
        return len(self._entries)

    def lookup(self, adapter: str, segments: Sequence[Segment], reusable: int) -> int:
        """Tokens served from cache: the leading run of the first `reusable` segments that is cached.

        A hit counts the looking-up request's own segment sizes and refreshes each hit segment.
        """
        entries = self._entries
        hit = 0
        for i in range(min(reusable, len(segments))):
            segment_key, tokens = segments[i]
            key = (adapter, segment_key)
            if key not in entries:
                break
            entries.move_to_end(key)
            hit += tokens
        return hit

    def insert(self, adapter: str, segments: Sequence[Segment]) -> None:
        """Record a computed prompt's segments (refreshing those already cached)."""
        entries = self._entries
        for segment_key, tokens in segments:
            key = (adapter, segment_key)
            if key in entries:
                entries.move_to_end(key)
            else:
                entries[key] = tokens
                self.tokens += tokens

    def trim(self, free_tokens: int) -> None:
        """Evict the least recently used segments until the cache fits in `free_tokens`."""
        entries = self._entries
        while entries and self.tokens > free_tokens:
            _, tokens = entries.popitem(last=False)
            self.tokens -= tokens
