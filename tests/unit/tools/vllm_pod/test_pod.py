"""The shared pod model's scheduler: budgets, aborts, the prefix cache in free KV, vLLM's KV count."""

from __future__ import annotations

from typing import Any

import pytest

from epp.tools.vllm_pod.cost import LatencyCost
from epp.tools.vllm_pod.lora import AdapterTier
from epp.tools.vllm_pod.pod import PodConfig, VllmPod
from epp.tools.vllm_pod.request import SimRequest

FLAT = LatencyCost(itl_batch_factor=0.0, lora_step_slowdown=0.0)


def pod(*, kv_tokens: int = 65536, **config: Any) -> VllmPod:
    return VllmPod("p", PodConfig(**config), FLAT, kv_capacity_tokens=kv_tokens, block_size=16)


def request(
    index: int, adapter: str = "", *, prompt: int = 10, output: int = 5, prefix: int = 0
) -> SimRequest:
    return SimRequest(index, 0.0, adapter, prompt, output, "system" if prefix else "", prefix)


def step(p: VllmPod, now: float) -> tuple[float, list[SimRequest]]:
    duration = p.begin_step(now)
    assert duration is not None
    return now + duration, p.end_step(now + duration)


def test_a_batch_full_of_sequences_defers_nothing() -> None:
    """vLLM stops reading its queue at max_num_seqs, so the requests behind were never skipped."""
    p = pod(max_loras=2, max_cpu_loras=4, max_num_seqs=8)
    for i in range(16):
        p.enqueue(request(i, f"lora-{i // 4}"))
    p.enqueue(request(16))
    p.begin_step(0.0)
    metrics = p.metrics(0.0)
    assert (metrics.running_requests, metrics.waiting_requests, metrics.deferred_requests) == (8, 9, 0)


def test_vllm_counts_a_skipped_request_as_deferred_until_the_pass_reaches_one_that_fits() -> None:
    p = pod(max_loras=1, max_cpu_loras=1)
    p.enqueue(request(0, "a", output=50))
    p.enqueue(request(1, "b"))  # skipped: the batch's one adapter slot holds a
    p.enqueue(request(2))  # the base model needs no slot: admitted past b
    p.begin_step(0.0)
    assert (p.running, p.waiting, p.metrics(0.0).deferred_requests) == (2, 1, 1)
    assert p.adapters_in_batch() == ("a",)


def test_kv_usage_counts_blocks_in_use_not_reserved_tokens() -> None:
    p = pod(kv_tokens=64)  # 4 blocks of 16
    for i in range(3):
        p.enqueue(request(i, prompt=10, output=20))  # each reserves 30 tokens and holds 1 block
    now, _ = step(p, 0.0)
    assert (p.running, p.waiting) == (2, 1)  # the third does not fit in KV
    assert p.kv_reserved_tokens == 60
    assert p.kv_cache_usage() == pytest.approx(2 / 4)  # 11 tokens each: one block each
    for _ in range(6):
        now, _ = step(p, now)
    assert p.kv_cache_usage() == pytest.approx(4 / 4)  # 17 tokens each: a second block each


def test_prefill_is_chunked_under_the_token_budget_after_the_decodes() -> None:
    p = pod(max_num_batched_tokens=100)
    p.enqueue(request(0, prompt=10, output=20))
    now, _ = step(p, 0.0)  # request 0 decodes from now on: one token of every step's budget
    long = request(1, prompt=250, output=2)
    p.enqueue(long)
    chunks = []
    while long.first_token_s is None:
        now, _ = step(p, now)
        chunks.append(p.last_prefill_tokens)
    assert chunks == [99, 99, 52]


@pytest.mark.parametrize("where", ["waiting", "prefilling", "decoding"])
def test_abort_releases_kv_and_the_adapter_pin(where: str) -> None:
    p = pod(max_loras=1, max_cpu_loras=1, max_num_seqs=1 if where == "waiting" else 8)
    blocker = request(0, "b", output=50)
    target = request(1, "a", output=50)
    if where == "waiting":
        p.enqueue(blocker)
    p.enqueue(target)
    p.begin_step(0.0)
    if where == "decoding":
        p.end_step(0.1)
    assert p.abort(target, 0.2) is True
    assert target.finish_s == 0.2 and p.abort(target, 0.3) is False
    if where == "prefilling":
        assert p.end_step(0.1) == [] and target.first_token_s is None
    assert "a" not in p.adapters_in_batch()
    if where != "waiting":
        assert (p.running, p.waiting, p.kv_reserved_tokens) == (0, 0, 0) and not p.has_work()


def test_cached_prefixes_live_in_free_kv() -> None:
    p = pod(kv_tokens=1200, max_loras=4)
    warm = request(0, "a", prompt=600, output=1, prefix=512)
    p.enqueue(warm)
    now, _ = step(p, 0.0)
    assert p.prefix_cache.tokens == 512
    p.enqueue(request(1, "b", prompt=1000, output=100))  # reserves 1100 of 1200 tokens
    p.begin_step(now)
    assert p.prefix_cache.tokens == 0  # the cached prefix made way for the reservation


def test_an_adapter_load_is_priced_by_the_cost_model_and_added_to_the_step() -> None:
    p = pod(max_loras=1, max_cpu_loras=2)
    p.enqueue(request(0, "a", prompt=10, output=1))
    duration = p.begin_step(0.0)
    assert [(a.adapter, a.source) for a in p.last_loads] == [("a", AdapterTier.DISK)]
    assert duration == pytest.approx(FLAT.time_to_first_token_s + FLAT.lora_load_latency_s)


def test_a_request_larger_than_the_kv_cache_is_refused() -> None:
    with pytest.raises(ValueError, match="KV cache"):
        pod(kv_tokens=32).enqueue(request(0, prompt=30, output=10))
