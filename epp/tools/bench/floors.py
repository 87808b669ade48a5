"""What no router could beat: the swap floor of a scenario's request list.

A router spreads requests over pods, each with `max_loras` GPU slots. Whatever it does, the
fleet's slots together never hold more adapters than one cache of `pods × max_loras` entries,
and no eviction order beats Belady's (evict the adapter whose next request is furthest away,
which needs to know the future). So for requests served in arrival order, the swaps of that
one clairvoyant cache are a lower bound on the swaps of any routing policy on the fleet.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence

NEVER = float("inf")


def belady_swaps(adapters: Sequence[str], capacity: int, *, counted_from: int = 0) -> int:
    """Evictions of a `capacity`-slot cache with furthest-next-use eviction, over `adapters`.

    `adapters` is the adapter of each request in arrival order ("" = the base model, which needs
    no slot). A load into a free slot is not a swap, as in the benchmark's own count. Only
    evictions at index ≥ `counted_from` are counted (the warm-up fills the cache uncounted).
    """
    return sum(1 for index in belady_evictions(adapters, capacity) if index >= counted_from)


def belady_evictions(adapters: Sequence[str], capacity: int) -> list[int]:
    """The indices of the requests at which that cache evicts, in order (see `belady_swaps`)."""
    if capacity < 1:
        raise ValueError("capacity must be at least 1")
    next_use = _next_uses(adapters)
    cached: dict[str, float] = {}  # adapter → index of its next request
    furthest: list[tuple[float, str]] = []  # max-heap by next use (negated), stale entries skipped
    evictions: list[int] = []
    for index, adapter in enumerate(adapters):
        if not adapter:
            continue
        if adapter not in cached and len(cached) >= capacity:
            while True:
                negated, victim = heapq.heappop(furthest)
                if cached.get(victim) == -negated:
                    break
            del cached[victim]
            evictions.append(index)
        cached[adapter] = next_use[index]
        heapq.heappush(furthest, (-next_use[index], adapter))
    return evictions


def _next_uses(adapters: Sequence[str]) -> list[float]:
    """For each request, the index of the next request for the same adapter (∞ if none)."""
    result = [NEVER] * len(adapters)
    seen: dict[str, int] = {}
    for index in range(len(adapters) - 1, -1, -1):
        adapter = adapters[index]
        if adapter:
            result[index] = seen.get(adapter, NEVER)
            seen[adapter] = index
    return result
