"""The simulated vLLM pod: slots, swaps, batching and what its /metrics say."""

from __future__ import annotations

import pytest

from epp.tools.bench.model import PROFILES, PodConfig, SimPod, SimRequest

PROFILE = PROFILES["llama-3.1-70b-h100-tp2"]


def _request(index: int, adapter: str, *, prompt: int = 100, output: int = 10, prefix: int = 0) -> SimRequest:
    return SimRequest(
        index=index,
        arrival_s=0.0,
        adapter=adapter,
        prompt_tokens=prompt,
        output_tokens=output,
        prefix_key="system" if prefix else "",
        prefix_tokens=prefix,
    )


def _drain(pod: SimPod, start_s: float = 0.0, max_steps: int = 100_000) -> tuple[float, list[SimRequest]]:
    """Run steps until the pod is idle; returns the end time and the finished requests in order."""
    now = start_s
    finished: list[SimRequest] = []
    for _ in range(max_steps):
        duration = pod.begin_step(now)
        if duration is None:
            return now, finished
        assert duration > 0
        now += duration
        finished += pod.end_step(now)
    raise AssertionError("pod did not drain")


def test_request_times_are_ordered_and_every_request_finishes() -> None:
    pod = SimPod("p", PROFILE, PodConfig(max_loras=2))
    requests = [_request(i, f"a{i % 3}", output=1 + i) for i in range(12)]
    for r in requests:
        pod.enqueue(r)
    _, finished = _drain(pod)
    assert sorted(r.index for r in finished) == list(range(12))
    for r in requests:
        assert r.first_token_s is not None and r.finish_s is not None
        assert 0.0 <= r.first_token_s <= r.finish_s
    assert pod.running == 0 and pod.waiting == 0 and pod.kv_reserved_tokens == 0


@pytest.mark.parametrize("max_loras", [1, 2, 4], ids=["1-slot", "2-slots", "4-slots"])
def test_batch_never_holds_more_adapters_than_slots(max_loras: int) -> None:
    pod = SimPod("p", PROFILE, PodConfig(max_loras=max_loras, max_cpu_loras=max_loras))
    for i in range(60):
        pod.enqueue(_request(i, f"a{i % 7}", output=5 + i % 13))
    now = 0.0
    while (duration := pod.begin_step(now)) is not None:
        assert len(pod.lora.gpu_adapters) <= max_loras
        assert len(pod.metrics(now).running_adapters) <= max_loras
        now += duration
        pod.end_step(now)
    assert pod.counters().max_distinct_adapters_in_batch == max_loras


def test_fifth_adapter_waits_for_a_slot_and_then_swaps() -> None:
    pod = SimPod("p", PROFILE, PodConfig(max_loras=4, max_cpu_loras=4))
    for i in range(4):
        pod.enqueue(_request(i, f"a{i}", output=50))
    late = _request(4, "a4", output=5)
    pod.enqueue(late)
    assert late.slot_blocked is False  # nothing was running when it arrived
    duration = pod.begin_step(0.0)
    assert duration is not None
    metrics = pod.metrics(0.0)
    assert metrics.deferred_requests == 1  # only visible as deferred, as in vLLM
    assert "a4" not in metrics.running_adapters
    pod.end_step(duration)
    _drain(pod, duration)
    assert late.caused_swap is True
    assert late.first_token_s is not None and late.first_token_s > 0
    assert pod.counters().swaps == 1


def test_resident_adapter_is_a_hit_and_causes_no_swap() -> None:
    pod = SimPod("p", PROFILE, PodConfig(max_loras=2))
    first = _request(0, "a0")
    pod.enqueue(first)
    end, _ = _drain(pod)
    second = _request(1, "a0")
    pod.enqueue(second)
    _drain(pod, end)
    assert (first.adapter_hit, second.adapter_hit) == (False, True)
    assert pod.counters().swaps == 0
    assert pod.counters().loads_from_disk == 1


def test_metrics_report_in_flight_adapters_only_and_both_labels_alike() -> None:
    pod = SimPod("p", PROFILE, PodConfig(max_loras=3))
    pod.enqueue(_request(0, "a0", output=100))
    pod.enqueue(_request(1, "", output=100))
    duration = pod.begin_step(0.0)
    assert duration is not None
    busy = pod.metrics(duration)
    assert busy.running_adapters == busy.waiting_adapters == frozenset({"a0"})
    assert busy.running_requests == 2 and busy.max_lora == 3 and busy.lora_enabled
    assert 0.0 < busy.kv_cache_usage < 1.0
    pod.end_step(duration)
    end, _ = _drain(pod, duration)
    idle = pod.metrics(end)
    assert "a0" in pod.lora.gpu_adapters  # still resident ...
    assert idle.running_adapters == frozenset()  # ... but invisible once idle
    assert idle.kv_cache_usage == 0.0


def test_prefix_cache_is_per_adapter() -> None:
    pod = SimPod("p", PROFILE, PodConfig(max_loras=4))
    warm = _request(0, "a0", prompt=600, prefix=512)
    pod.enqueue(warm)
    end, _ = _drain(pod)
    same = _request(1, "a0", prompt=600, prefix=512)
    other = _request(2, "a1", prompt=600, prefix=512)
    pod.enqueue(same)
    pod.enqueue(other)
    _drain(pod, end)
    assert (warm.cached_tokens, same.cached_tokens, other.cached_tokens) == (0, 512, 0)


def test_bigger_batches_decode_slower_per_step() -> None:
    def first_decode_step(batch: int) -> float:
        pod = SimPod("p", PROFILE, PodConfig())
        for i in range(batch):
            pod.enqueue(_request(i, "", prompt=10, output=100))
        duration = pod.begin_step(0.0)
        assert duration is not None
        pod.end_step(duration)
        decode = pod.begin_step(duration)
        assert decode is not None
        return decode

    assert first_decode_step(1) < first_decode_step(50) < first_decode_step(200)


def test_kv_capacity_limits_admission() -> None:
    pod = SimPod("p", PROFILE, PodConfig())
    big = PROFILE.kv_capacity_tokens // 2
    requests = [_request(i, "", prompt=big - 10, output=5) for i in range(3)]
    for r in requests:
        pod.enqueue(r)
    duration = pod.begin_step(0.0)
    assert duration is not None
    assert pod.running == 2 and pod.waiting == 1
    pod.end_step(duration)
    _drain(pod, duration)
    assert all(r.finish_s is not None for r in requests)


def test_invalid_config_is_rejected() -> None:
    with pytest.raises(ValueError, match="max_loras"):
        SimPod("p", PROFILE, PodConfig(max_loras=0))
