"""`epp.picker.scrape.parse` reads a real vLLM's `/metrics` exactly, idle and under LoRA slot pressure.

Each scrape is read twice: by our scraper and by `RawPage`, a separate line-by-line reader in
this tier. The expected values follow vLLM 0.32.0's documented semantics directly from the raw
samples (newest `lora_requests_info` by value, `reason="deferred"`, cache config labels).
"""

from __future__ import annotations

import concurrent.futures
import time

import pytest

from epp.picker.datastore.types import Metrics
from epp.picker.scrape.parse import parse_metrics
from testkit.reference_parse import parse_metrics_unfiltered
from testkit.waiting import poll_until
from tests.realvllm.client import (
    BASE_MODEL,
    RawPage,
    RealPod,
    adapters,
    completion,
    idle,
    scrape,
)

SLOT_HOLDERS = ("lora-0", "lora-0", "lora-1", "lora-1")
LONG_TOKENS = 300  # ≈ 4 s of decode on 2 cores: long enough to scrape mid-flight
SHORT_TOKENS = 5


def expected_from_raw(text: str, now: float) -> Metrics:
    page = RawPage.parse(text)
    model = {"model_name": BASE_MODEL}
    newest = page.newest_lora()
    cache = page.series("vllm:cache_config_info")
    assert len(cache) == 1
    return Metrics(
        updated_at=now,
        waiting_requests=int(page.value("vllm:num_requests_waiting", **model)),
        running_requests=int(page.value("vllm:num_requests_running", **model)),
        deferred_requests=int(page.value("vllm:num_requests_waiting_by_reason", **model, reason="deferred")),
        kv_cache_usage=page.value("vllm:kv_cache_usage_perc", **model),
        lora_enabled="vllm:lora_requests_info" in page.types,
        max_lora=int(newest.labels["max_lora"]) if newest else 0,
        running_adapters=adapters(newest.labels["running_lora_adapters"]) if newest else frozenset(),
        waiting_adapters=adapters(newest.labels["waiting_lora_adapters"]) if newest else frozenset(),
        block_size=int(cache[0].labels["block_size"]),
        num_gpu_blocks=int(cache[0].labels["num_gpu_blocks"]),
        served_model_name=BASE_MODEL,
    )


def assert_exact(text: str) -> Metrics:
    now = time.time()
    got = parse_metrics(text, now)
    assert got == expected_from_raw(text, now)
    assert parse_metrics_unfiltered(text, now) == got  # the line filter loses nothing on a real page
    return got


def test_idle_page_is_read_exactly(real_pods: list[RealPod]) -> None:
    assert poll_until(lambda: idle(real_pods), within_s=60)
    for pod in real_pods:
        got = assert_exact(scrape(pod))
        assert (got.waiting_requests, got.running_requests, got.deferred_requests) == (0, 0, 0)
        assert got.lora_enabled
        # The server's flags, as the scrape shows them: CPU default block 128, 1 GiB of KV.
        assert (got.block_size, got.num_gpu_blocks) == (128, 8192)
        assert got.running_adapters == got.waiting_adapters  # vLLM 0.32.0 reports one set twice


def test_busy_page_with_a_deferred_adapter_is_read_exactly(real_pods: list[RealPod]) -> None:
    """Both slots held by long requests, then a third adapter arrives: it waits as "deferred"."""
    pod = real_pods[0]
    assert poll_until(lambda: idle([pod]), within_s=60)
    with concurrent.futures.ThreadPoolExecutor(max_workers=len(SLOT_HOLDERS) + 2) as pool:
        holders = [pool.submit(completion, pod.url, model, LONG_TOKENS) for model in SLOT_HOLDERS]
        assert poll_until(
            lambda: RawPage.parse(scrape(pod)).value("vllm:num_requests_running", model_name=BASE_MODEL) == 4,
            within_s=30,
        )
        late = [pool.submit(completion, pod.url, "lora-2", SHORT_TOKENS)]
        pages: list[str] = []

        def deferred_seen() -> bool:
            text = scrape(pod)
            pages.append(text)
            page = RawPage.parse(text)
            return (
                page.value("vllm:num_requests_waiting_by_reason", model_name=BASE_MODEL, reason="deferred")
                >= 1
            )

        assert poll_until(deferred_seen, within_s=30, interval_s=0.05), "no deferred request seen"
        busy = assert_exact(pages[-1])
        assert busy.running_requests == 4
        assert busy.deferred_requests == 1 and busy.waiting_requests == 1
        assert busy.max_lora == 2
        # The waiting adapter is invisible in lora_requests_info until it runs (vLLM's behaviour).
        assert busy.active_adapters == {"lora-0", "lora-1"}
        assert busy.kv_cache_usage > 0.0
        replies = [f.result() for f in holders + late]
    assert all(r.status == 200 for r in replies), [r.body[:200] for r in replies if r.status != 200]
    # After the drain the newest combination is the empty one; the scraper must not keep old adapters.
    assert poll_until(lambda: idle([pod]), within_s=30)
    assert poll_until(lambda: not parse_metrics(scrape(pod), time.time()).active_adapters, within_s=10)
    assert_exact(scrape(pod))


@pytest.mark.parametrize("adapter", ["lora-2", "lora-3"], ids=["lora-2", "lora-3"])
def test_page_during_a_single_adapter_request_is_read_exactly(real_pods: list[RealPod], adapter: str) -> None:
    pod = real_pods[1]
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        future = pool.submit(completion, pod.url, adapter, 150)
        seen: list[Metrics] = []

        def adapter_seen() -> bool:
            seen.append(assert_exact(scrape(pod)))
            return adapter in seen[-1].active_adapters

        assert poll_until(adapter_seen, within_s=30, interval_s=0.05)
        assert seen[-1].running_requests == 1
        assert future.result().status == 200
