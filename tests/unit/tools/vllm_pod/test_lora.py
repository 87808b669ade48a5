"""GPU slots and the host tier: bounded, LRU, pinned adapters never evicted."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from epp.tools.vllm_pod.lora import AdapterTier, LoraSlots


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
    slots: int, extra_cpu: int, ops: list[tuple[str, str, set[str]]]
) -> None:
    cache = LoraSlots(max_gpu_slots=slots, max_cpu_adapters=slots + extra_cpu)
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
        assert set(cache.gpu_adapters) <= set(cache.cpu_adapters)


def test_an_adapter_evicted_from_its_slot_comes_back_from_host_memory() -> None:
    """vLLM's tier is inclusive and every use refreshes it: a GPU resident keeps its host copy, so
    an adapter swapped out reloads from host memory until newer adapters push its copy out."""
    cache = LoraSlots(max_gpu_slots=2, max_cpu_adapters=3)
    cache.activate("a", pinned=())
    cache.activate("b", pinned=())
    cache.activate("a", pinned=())  # a GPU hit refreshes a in both tiers
    assert (cache.gpu_adapters, cache.cpu_adapters) == (("b", "a"), ("b", "a"))
    assert cache.activate("c", pinned={"a"}).evicted_from_gpu == "b"
    assert cache.activate("b", pinned={"c"}).source is AdapterTier.CPU  # swapped back from host memory
    # d fills the host tier past 3: the oldest copy not on the GPU goes (a, once b took a's slot).
    assert cache.activate("d", pinned={"b"}).evicted_from_gpu == "c"
    assert set(cache.cpu_adapters) == {"b", "c", "d"}
    assert cache.activate("a", pinned={"d"}).source is AdapterTier.DISK


def test_registering_adapters_fills_host_memory_and_the_gpu_slots_as_vllm_startup_does() -> None:
    """vLLM 0.32.0 with --max-loras 2 --max-cpu-loras 4 and four --lora-modules: all four in host
    memory, the last two registered in the slots (its DEBUG log: "Activating LoRA" per module)."""
    cache = LoraSlots(max_gpu_slots=2, max_cpu_adapters=4)
    for name in ("lora-0", "lora-1", "lora-2", "lora-3"):
        assert cache.register(name, pinned=())
    assert cache.gpu_adapters == ("lora-2", "lora-3")
    assert cache.cpu_adapters == ("lora-0", "lora-1", "lora-2", "lora-3")


def test_registering_never_takes_a_pinned_slot() -> None:
    cache = LoraSlots(max_gpu_slots=1, max_cpu_adapters=2)
    cache.activate("a", pinned=())
    assert cache.register("b", pinned={"a"})
    assert (cache.gpu_adapters, cache.tier("b")) == (("a",), AdapterTier.CPU)


def test_an_unloaded_adapter_keeps_its_room_until_evicted_and_a_reload_reads_storage() -> None:
    """The sequence a real vLLM 0.32.0 logged: unload frees nothing; the next registration evicts
    the unloaded copy as the oldest in host memory; the same name loaded again is a new adapter."""
    cache = LoraSlots(max_gpu_slots=2, max_cpu_adapters=4)
    for name in ("lora-0", "lora-1", "lora-2", "lora-3"):
        cache.register(name, pinned=())
    for name in ("lora-0", "lora-1", "lora-2", "lora-3"):
        assert cache.activate(name, pinned=()).source is AdapterTier.CPU
    cache.forget("lora-0")
    assert cache.tier("lora-0") is AdapterTier.DISK
    assert len(cache.cpu_adapters) == 4  # its copy still takes host room
    cache.register("lora-4", pinned=())
    assert cache.gpu_adapters == ("lora-3", "lora-4")
    assert cache.cpu_adapters == ("lora-1", "lora-2", "lora-3", "lora-4")  # the unloaded copy went
    cache.forget("lora-3")  # on the GPU: its slot stays taken until LRU reaches it
    assert len(cache.gpu_adapters) == 2 and cache.on_gpu("lora-3") is False
    assert cache.activate("lora-0", pinned={"lora-4"}).source is AdapterTier.DISK
    assert cache.gpu_adapters == ("lora-4", "lora-0")
