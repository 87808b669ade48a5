"""In-flight accounting (burst between scrapes) and the adapter-aware prefix index."""

from __future__ import annotations

import pytest

from epp.picker.scheduling.inflight import Flight, InflightTracker
from epp.picker.scheduling.prefix import PrefixIndex, prefix_hashes


def test_inflight_counts_and_since_scrape() -> None:
    t = InflightTracker()
    t.add("r1", "p", "a", 1.0)
    t.add("r2", "p", "a", 2.0)
    t.add("r3", "p", "b", 3.0)
    assert t.count("p") == 3
    assert t.routed_since("p", 1.5) == 2
    assert t.adapter_count("p", "a") == 2
    assert t.adapters("p") == {"a": 2, "b": 1}
    assert t.get("r2") == Flight("r2", "p", "a", 2.0)
    assert t.remove("r2") == Flight("r2", "p", "a", 2.0)  # what was in flight, where and since when
    assert t.get("r2") is None
    assert t.routed_since("p", 1.5) == 1
    assert t.adapter_count("p", "a") == 1
    assert t.remove("unknown") is None
    assert [f.key for f in t] == ["r1", "r3"]  # oldest first
    t.remove("r1")
    t.remove("r3")
    assert t.adapters("p") is None and t.count("p") == 0


def test_a_repeated_key_moves_and_a_flight_keeps_its_origin() -> None:
    t = InflightTracker()
    t.add("r1", "p", "a", 1.0)
    t.add("peer/r9", "q", "", 1.5, origin="peer")  # a peer's base-model request
    t.add("r1", "q", "a", 2.0)  # routed again elsewhere: moved, not counted twice
    assert (t.count("p"), t.count("q"), len(t)) == (0, 2, 2)
    assert t.adapters("p") is None
    assert t.adapters("q") == {"": 1, "a": 1}
    assert list(t) == [Flight("peer/r9", "q", "", 1.5, "peer"), Flight("r1", "q", "a", 2.0)]


def test_count_since_scrape_follows_every_change_to_the_endpoint() -> None:
    t = InflightTracker()
    t.add("r1", "p", "a", 2.0)
    assert t.routed_since("p", 1.0) == 1
    t.add("r2", "p", "a", 3.0)
    assert t.routed_since("p", 1.0) == 2
    assert t.routed_since("p", 2.5) == 1  # a newer scrape
    t.remove("r2")
    assert t.routed_since("p", 2.5) == 0
    assert t.routed_since("p", 1.0) == 1
    t.remove("r1")
    t.forget(set())
    t.add("r3", "p", "a", 4.0)  # counters start again after forget: no stale answer
    assert t.routed_since("p", 1.0) == 1


def test_inflight_expires_lost_completions_and_is_bounded() -> None:
    dropped: list[tuple[Flight, float]] = []
    t = InflightTracker(
        request_timeout_s=10.0, max_tracked=100, on_drop=lambda f, now: dropped.append((f, now))
    )
    t.add("old", "p", "a", 0.0)
    t.add("new", "p", "a", 11.0)
    assert t.count("p") == 1
    assert dropped == [(Flight("old", "p", "a", 0.0), 11.0)]  # its completion never came: told once
    for i in range(1000):
        t.add(f"r{i}", "q", "a", 12.0)
    assert len(t) <= 100
    # Every request let go by the bound is told of, once, oldest first; the rest are still held.
    assert len(dropped) == 1 + 1000 + 1 - len(t)
    assert [f.key for f, _ in dropped[1:3]] == ["new", "r0"]
    assert len({f.key for f, _ in dropped}) == len(dropped)
    assert not {f.key for f, _ in dropped} & {f.key for f in t}


def test_removing_a_flight_is_not_a_drop() -> None:
    dropped: list[Flight] = []
    t = InflightTracker(request_timeout_s=10.0, on_drop=lambda f, now: dropped.append(f))
    t.add("r1", "p", "a", 0.0)
    t.remove("r1")
    t.add("r1", "p", "a", 1.0)
    t.add("r1", "q", "a", 2.0)  # moved
    t.add("r2", "p", "a", 5.0)
    assert dropped == []


@pytest.mark.parametrize(
    ("prompt_len", "block", "max_blocks", "expected"),
    [(0, 64, 256, 0), (63, 64, 256, 0), (64, 64, 256, 1), (200, 64, 256, 3), (64 * 300, 64, 256, 256)],
    ids=["empty", "partial-block", "one-block", "trailing-ignored", "capped"],
)
def test_block_count(prompt_len: int, block: int, max_blocks: int, expected: int) -> None:
    assert (
        len(prefix_hashes("m", "x" * prompt_len, block_size_chars=block, max_blocks=max_blocks)) == expected
    )


def test_hashes_are_per_model_and_chained() -> None:
    prompt = "abcd" * 64
    a = prefix_hashes("lora-a", prompt, block_size_chars=64, max_blocks=256)
    b = prefix_hashes("lora-b", prompt, block_size_chars=64, max_blocks=256)
    assert not set(a) & set(b), "an adapter never matches another adapter's blocks"
    assert len(set(a)) == len(a), "identical blocks at different depths hash differently"


def test_match_counts_leading_blocks_per_endpoint() -> None:
    index = PrefixIndex()
    h = prefix_hashes("m", "s" * 64 * 4, block_size_chars=64, max_blocks=256)
    index.record("p1", h[:2])
    index.record("p2", h)
    index.record("p3", h[1:])  # no block 0: no prefix match at all
    assert index.match(h) == {"p1": 2, "p2": 4}


def test_lru_capacity_evicts_and_forgets() -> None:
    index = PrefixIndex(default_capacity_per_endpoint=3)
    h = prefix_hashes("m", "z" * 64 * 5, block_size_chars=64, max_blocks=256)
    index.record("p", h)
    assert len(index) == 3
    assert index.match(h) == {}  # the leading blocks were evicted first
    index.set_capacity("p", 1)
    assert len(index) == 1
    index.forget([])
    assert len(index) == 0
