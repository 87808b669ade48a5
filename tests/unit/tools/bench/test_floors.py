"""The swap floor: a clairvoyant cache of all the fleet's slots."""

from __future__ import annotations

import itertools
import random

import pytest

from epp.tools.bench.floors import belady_evictions, belady_swaps


def _lru_swaps(adapters: list[str], capacity: int) -> int:
    cache: list[str] = []
    swaps = 0
    for adapter in adapters:
        if adapter in cache:
            cache.remove(adapter)
        elif len(cache) >= capacity:
            cache.pop(0)
            swaps += 1
        cache.append(adapter)
    return swaps


def _best_possible(adapters: list[str], capacity: int) -> int:
    """Exhaustive search over every eviction choice (tiny inputs only)."""
    best = len(adapters)

    def walk(index: int, cache: frozenset[str], swaps: int) -> None:
        nonlocal best
        if swaps >= best:
            return
        if index == len(adapters):
            best = swaps
            return
        adapter = adapters[index]
        if adapter in cache or len(cache) < capacity:
            walk(index + 1, cache | {adapter}, swaps)
            return
        for victim in cache:
            walk(index + 1, (cache - {victim}) | {adapter}, swaps + 1)

    walk(0, frozenset(), 0)
    return best


def test_no_swaps_when_every_adapter_fits() -> None:
    assert belady_swaps(["a", "b", "c", "a", "b", "c"] * 10, 3) == 0


def test_the_base_model_needs_no_slot() -> None:
    assert belady_swaps(["a", "", "b", "", "a", "b"], 2) == 0


def test_evicts_the_adapter_needed_furthest_ahead() -> None:
    # With 2 slots, on "c" the clairvoyant cache drops "b" (next needed last), LRU drops "a".
    sequence = ["a", "b", "c", "a", "c", "a", "b"]
    assert belady_swaps(sequence, 2) == 2
    assert belady_evictions(sequence, 2) == [2, 6]  # "c" evicts "b"; "b" evicts "c" (never needed again)
    assert _lru_swaps(sequence, 2) > belady_swaps(sequence, 2)


@pytest.mark.parametrize("seed", range(30))
def test_matches_an_exhaustive_search_on_small_inputs(seed: int) -> None:
    rng = random.Random(seed)
    sequence = [rng.choice("abcde") for _ in range(rng.randint(1, 11))]
    capacity = rng.randint(1, 3)
    assert belady_swaps(sequence, capacity) == _best_possible(sequence, capacity)


def test_never_above_lru() -> None:
    rng = random.Random(7)
    sequence = [f"x{min(int(rng.paretovariate(1.0)), 40)}" for _ in range(3000)]
    for capacity in (1, 4, 16):
        assert belady_swaps(sequence, capacity) <= _lru_swaps(sequence, capacity)


def test_warm_up_evictions_are_not_counted() -> None:
    sequence = list(itertools.chain.from_iterable(["a", "b", "c"] for _ in range(4)))
    total = belady_swaps(sequence, 2)
    assert belady_swaps(sequence, 2, counted_from=6) < total
    assert belady_swaps(sequence, 2, counted_from=len(sequence)) == 0


def test_capacity_must_be_positive() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        belady_swaps(["a"], 0)
