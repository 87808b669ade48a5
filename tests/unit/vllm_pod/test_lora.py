"""GPU slots and the host tier: bounded, LRU, pinned adapters never evicted."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from epp.tools.vllm_pod.lora import AdapterTier, HostTier, LoraSlots


@pytest.mark.parametrize(
    ("uses", "expected_gpu", "expected_evictions"),
    [
        (["a", "b"], ("a", "b"), [None, None]),
        (["a", "b", "c"], ("b", "c"), [None, None, "a"]),
        (["a", "b", "a", "c"], ("a", "c"), [None, None, None, "b"]),
        (["a", "a", "a"], ("a",), [None, None, None]),
    ],
    ids=["fill", "evict-oldest", "reuse-refreshes", "same-adapter"],
)
def test_gpu_slots_evict_least_recently_used(
    uses: list[str], expected_gpu: tuple[str, ...], expected_evictions: list[str | None]
) -> None:
    cache = LoraSlots(max_gpu_slots=2, max_cpu_adapters=4)
    evictions = [cache.activate(name, pinned=()).evicted_from_gpu for name in uses]
    assert evictions == expected_evictions
    assert set(cache.gpu_adapters) == set(expected_gpu)


def test_pinned_adapters_are_never_evicted() -> None:
    cache = LoraSlots(max_gpu_slots=2, max_cpu_adapters=2)
    cache.activate("a", pinned=())
    cache.activate("b", pinned={"a"})
    assert cache.can_activate("c", pinned={"a", "b"}) is False
    with pytest.raises(ValueError, match="pinned"):
        cache.activate("c", pinned={"a", "b"})
    # Only "b" is free to go even though "a" is older.
    assert cache.activate("c", pinned={"a"}).evicted_from_gpu == "b"
    assert set(cache.gpu_adapters) == {"a", "c"}


@pytest.mark.parametrize(
    ("preloaded", "adapter", "source"),
    [
        ([], "a", AdapterTier.DISK),
        (["a"], "a", AdapterTier.CPU),
    ],
    ids=["from-disk", "from-host-memory"],
)
def test_activation_reports_where_weights_came_from(
    preloaded: list[str], adapter: str, source: AdapterTier
) -> None:
    cache = LoraSlots(max_gpu_slots=1, max_cpu_adapters=2)
    for name in preloaded:
        assert cache.load_to_cpu(name, pinned=())
    assert cache.activate(adapter, pinned=()).source is source
    assert cache.activate(adapter, pinned=()).source is AdapterTier.GPU
    assert cache.tier(adapter) is AdapterTier.GPU


def test_cpu_tier_drops_host_copies_before_gpu_residents() -> None:
    cache = LoraSlots(max_gpu_slots=1, max_cpu_adapters=2)
    cache.activate("a", pinned=())  # a on GPU and in host memory
    cache.load_to_cpu("b", pinned=())
    cache.load_to_cpu("c", pinned=())  # host full: b (not on GPU) goes, a stays
    assert cache.cpu_adapters == ("a", "c")
    assert cache.tier("b") is AdapterTier.DISK


@pytest.mark.parametrize(("gpu", "cpu"), [(0, 1), (2, 1)], ids=["no-slots", "cpu-smaller-than-gpu"])
def test_rejects_impossible_sizes(gpu: int, cpu: int) -> None:
    with pytest.raises(ValueError):
        LoraSlots(max_gpu_slots=gpu, max_cpu_adapters=cpu)


@settings(max_examples=200, deadline=None)
@given(
    host_tier=st.sampled_from(HostTier),
    slots=st.integers(1, 3),
    extra_cpu=st.integers(0, 3),
    ops=st.lists(
        st.tuples(
            st.sampled_from(["activate", "load"]),
            st.sampled_from("abcdef"),
            st.sets(st.sampled_from("abcdef")),
        ),
        max_size=40,
    ),
)
def test_bounds_hold_under_any_sequence(
    host_tier: HostTier, slots: int, extra_cpu: int, ops: list[tuple[str, str, set[str]]]
) -> None:
    cache = LoraSlots(max_gpu_slots=slots, max_cpu_adapters=slots + extra_cpu, host_tier=host_tier)
    for op, name, pinned_candidates in ops:
        pinned = pinned_candidates & set(cache.gpu_adapters)
        if op == "activate":
            if cache.can_activate(name, pinned):
                before = set(cache.gpu_adapters)
                evicted = cache.activate(name, pinned).evicted_from_gpu
                assert evicted is None or (evicted in before and evicted not in pinned)
                assert pinned <= set(cache.gpu_adapters)
        else:
            cache.load_to_cpu(name, pinned)
            assert pinned <= set(cache.gpu_adapters)
        assert len(cache.gpu_adapters) <= slots
        assert len(cache.cpu_adapters) <= slots + extra_cpu
        if host_tier is HostTier.INCLUSIVE:
            assert set(cache.gpu_adapters) <= set(cache.cpu_adapters)


def test_load_history_host_tier_remembers_loads_not_uses() -> None:
    """`epp bench`'s host tier: the last adapters loaded into a slot, whether or not still on the GPU."""
    cache = LoraSlots(max_gpu_slots=2, max_cpu_adapters=2, host_tier=HostTier.LOAD_HISTORY)
    cache.activate("a", pinned=())
    cache.activate("b", pinned=())
    cache.activate("a", pinned=())  # a GPU hit: the GPU LRU moves, the host tier does not
    assert (cache.gpu_adapters, cache.cpu_adapters) == (("b", "a"), ("a", "b"))
    assert cache.activate("c", pinned={"a"}).evicted_from_gpu == "b"
    # c's load pushed a (the oldest load) out of host memory though a is still on the GPU.
    assert (cache.gpu_adapters, cache.cpu_adapters) == (("a", "c"), ("b", "c"))
    assert cache.activate("b", pinned={"c"}).source is AdapterTier.CPU
    assert cache.activate("a", pinned={"b"}).source is AdapterTier.DISK
