"""The residency model: LRU GPU slots from our routing and each scrape, CPU tier, gaps."""

from __future__ import annotations

import pytest

from epp.picker.scheduling.inflight import InflightTracker
from epp.picker.scheduling.residency import ResidencyModel, ResidencyParams
from tests.unit.picker.scheduling.helpers import endpoint_state

POD = "pod-0-rank-0"


def _model(**params: float) -> tuple[ResidencyModel, InflightTracker]:
    inflight = InflightTracker()
    return ResidencyModel(inflight, ResidencyParams(**params)), inflight  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("routed", "slots", "expected_gpu", "expected_cpu"),
    [
        (["a"], 2, ["a"], []),
        (["a", "b"], 2, ["a", "b"], []),
        (["a", "b", "c"], 2, ["b", "c"], ["a"]),
        (["a", "b", "a", "c"], 2, ["a", "c"], ["b"]),
        (["a", "b", "c", "d", "e"], 2, ["d", "e"], ["b", "c"]),
    ],
    ids=["one", "fill", "evict-lru", "touch-refreshes", "cpu-tier-bounded"],
)
def test_routing_keeps_lru_slots(
    routed: list[str], slots: int, expected_gpu: list[str], expected_cpu: list[str]
) -> None:
    model, _ = _model(default_max_lora=slots)
    for adapter in routed:
        model.on_routed(POD, adapter)
    pod = model.pod(POD)
    assert pod is not None
    assert list(pod.gpu) == expected_gpu
    assert list(pod.cpu) == expected_cpu[-pod.cpu_slots :]
    for adapter in expected_gpu:
        assert POD in model.homes(adapter)
    for adapter in expected_cpu:
        assert POD not in model.homes(adapter)


def test_adapter_with_inflight_request_is_not_evicted() -> None:
    model, inflight = _model(default_max_lora=2)
    model.on_routed(POD, "a")
    inflight.add("r1", POD, "a", 0.0)
    model.on_routed(POD, "b")
    model.on_routed(POD, "c")  # a is LRU but busy: b goes
    pod = model.pod(POD)
    assert pod is not None and list(pod.gpu) == ["a", "c"]


def test_all_slots_busy_overcommits_until_one_frees() -> None:
    model, inflight = _model(default_max_lora=1)
    model.on_routed(POD, "a")
    inflight.add("r1", POD, "a", 0.0)
    model.on_routed(POD, "b")
    pod = model.pod(POD)
    assert pod is not None and list(pod.gpu) == ["a", "b"]  # b waits for the slot, as vLLM defers it
    assert model.victim(POD, pod) == "b"  # the idle one; "a" is busy


def test_scrape_adds_active_adapters_and_slot_count() -> None:
    model, _ = _model(default_max_lora=4)
    model.observe(endpoint_state(0, updated_at=1.0, max_lora=2, active={"x"}))
    pod = model.pod(POD)
    assert pod is not None
    assert pod.slots == 2
    assert "x" in pod.gpu and POD in model.homes("x")


@pytest.mark.parametrize(
    ("gap_s", "expect_resident", "expect_confidence"),
    [(1.0, True, 1.0), (20.0, True, 0.5), (120.0, False, None)],
    ids=["normal-gap", "long-gap-halves-confidence", "restart-gap-clears"],
)
def test_scrape_gaps_decay_confidence(
    gap_s: float, expect_resident: bool, expect_confidence: float | None
) -> None:
    model, _ = _model(default_max_lora=2, confidence_gap_s=10.0, reset_gap_s=60.0)
    model.observe(endpoint_state(0, updated_at=1.0))
    model.on_routed(POD, "a")
    model.observe(endpoint_state(0, updated_at=1.0 + gap_s))
    pod = model.pod(POD)
    assert pod is not None
    assert ("a" in pod.gpu) is expect_resident
    assert pod.gpu.get("a") == expect_confidence


def test_forget_drops_departed_pods() -> None:
    model, _ = _model()
    model.on_routed(POD, "a")
    model.on_routed("other", "a")
    model.forget(["other"])
    assert model.pod(POD) is None
    assert set(model.homes("a")) == {"other"}


def test_bounded_at_scale() -> None:
    model, _ = _model(default_max_lora=4)
    for i in range(20_000):
        model.on_routed(f"pod-{i % 100}", f"adapter-{i % 1000}")
    assert len(model) == 100
    for i in range(100):
        pod = model.pod(f"pod-{i}")
        assert pod is not None and len(pod.gpu) <= 4 and len(pod.cpu) <= 4


def test_victim_follows_inflight_changes_despite_its_cache() -> None:
    """`victim` is cached per pod; every add/complete on the pod must still show at once."""
    model, inflight = _model(default_max_lora=2)
    for i, adapter in enumerate(["a", "b"]):
        inflight.add(f"r{i}", POD, adapter, 0.0)
        model.on_routed(POD, adapter)
    pod = model.pod(POD)
    assert pod is not None
    assert model.victim(POD, pod) is None  # both busy
    assert model.victim(POD, pod) is None  # cached answer, same
    inflight.remove("r1")
    assert model.victim(POD, pod) == "b"
    inflight.remove("r0")
    assert model.victim(POD, pod) == "a"  # LRU first
    inflight.add("r2", POD, "a", 1.0)
    assert model.victim(POD, pod) == "b"
    model.on_routed(POD, "c")  # evicts b
    assert list(pod.gpu) == ["a", "c"]
    assert model.victim(POD, pod) == "c"  # a still in flight, c idle
    assert model.lightest_holder(POD, pod) == ("c", 0)


def test_sorted_homes_follow_routing_and_eviction() -> None:
    model, _ = _model(default_max_lora=1)
    model.on_routed("pod-b", "a")
    model.on_routed("pod-a", "a")
    assert model.sorted_homes("a") == ("pod-a", "pod-b")
    model.on_routed("pod-a", "a")  # already a home: unchanged
    assert model.sorted_homes("a") == ("pod-a", "pod-b")
    model.on_routed("pod-b", "other")  # one slot: evicts "a" from pod-b
    assert model.sorted_homes("a") == ("pod-a",)
    model.forget(["pod-b"])
    assert model.sorted_homes("a") == ()
