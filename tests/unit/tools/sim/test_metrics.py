"""/metrics matches real vLLM 0.32.0: families, types, labels, HELP, buckets and lora_requests_info quirks.

Reference: tests/fixtures/vllm-0.32.0/ (real captures, see its README).
"""

from __future__ import annotations

import asyncio
import itertools
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from epp.clock import FakeClock
from epp.tools.sim.driver import EngineDriver
from epp.tools.sim.engine import Engine, EngineConfig, TokenEvent
from epp.tools.sim.metrics import SimMetrics

FIXTURES = Path(__file__).resolve().parents[3] / "fixtures" / "vllm-0.32.0"

Catalog = dict[str, tuple[str, frozenset[str], str]]


def load_catalog() -> Catalog:
    catalog: Catalog = {}
    for line in (FIXTURES / "metric_catalog.tsv").read_text().splitlines():
        if line.startswith("#") or not line.strip():
            continue
        name, kind, labels, help_text = line.split("\t")
        catalog[name] = (kind, frozenset(labels.removeprefix("labels=").split(",")), help_text)
    return catalog


def catalog_of(page: str, prefix: str = "vllm:") -> Catalog:
    """Derive catalog rows from an exposition page the way metric_catalog.tsv was derived."""
    found: Catalog = {}
    for family in text_string_to_metric_families(page):
        if not family.name.startswith(prefix) or family.name.endswith("_created"):
            continue
        name = family.name + "_total" if family.type == "counter" else family.name
        labels = frozenset(k for s in family.samples for k in s.labels if k != "le")
        found[name] = (family.type, labels, family.documentation)
    return found


def buckets_of(page: str) -> dict[str, tuple[str, ...]]:
    result: dict[str, list[str]] = {}
    for family in text_string_to_metric_families(page):
        if family.type == "histogram" and family.name.startswith("vllm:"):
            seen = [s.labels["le"] for s in family.samples if s.name.endswith("_bucket")]
            result[family.name] = list(dict.fromkeys(seen))
    return {k: tuple(v) for k, v in result.items()}


def lora_samples(page: str) -> list[Sample]:
    for family in text_string_to_metric_families(page):
        if family.name == "vllm:lora_requests_info":
            return list(family.samples)
    raise AssertionError("vllm:lora_requests_info family missing")


def newest_lora_adapters(page: str) -> str:
    return max(lora_samples(page), key=lambda s: s.value).labels["running_lora_adapters"]


class Pod:
    """An engine, its metrics and driver on fake time, with a strictly increasing wall clock."""

    def __init__(self, config: EngineConfig, *, lora_enabled: bool = True) -> None:
        self.clock = FakeClock()
        ticks = itertools.count(1)
        self.metrics = SimMetrics(
            model_name="base",
            config=config,
            max_model_len=2048,
            lora_enabled=lora_enabled,
            wall_clock=lambda: 1.7e9 + next(ticks),
        )
        self.engine = Engine(config)
        self.driver = EngineDriver(self.engine, self.metrics, self.clock)

    def page(self) -> str:
        return self.metrics.render().decode()


async def finish(queue: asyncio.Queue[TokenEvent]) -> int:
    count = 0
    while True:
        event = await queue.get()
        count += 1
        if event.finish_reason is not None:
            return count


async def run_load(pod: Pod, requests: list[tuple[str | None, int]]) -> None:
    task = asyncio.create_task(pod.driver.run())
    try:
        queues = [pod.driver.submit(adapter, ["<s>", *["w"] * 40], n)[1] for adapter, n in requests]
        await asyncio.wait_for(asyncio.gather(*(finish(q) for q in queues)), timeout=10)
    finally:
        task.cancel()


CONFIG = EngineConfig(max_loras=2, max_cpu_loras=4, max_num_seqs=8, block_size=16)


async def test_families_types_labels_and_help_match_the_real_catalog() -> None:
    pod = Pod(CONFIG)
    await run_load(pod, [("lora-0", 3), ("lora-1", 2), (None, 2)])
    expected = load_catalog()
    actual = catalog_of(pod.page())
    missing = sorted(set(expected) - set(actual))
    extra = sorted(set(actual) - set(expected))
    assert missing == [] and extra == []
    drift = {name: (actual[name], expected[name]) for name in expected if actual[name] != expected[name]}
    assert drift == {}


def test_catalog_derivation_reproduces_the_catalog_from_a_real_scrape() -> None:
    """Guards the comparison itself: applied to a real vLLM scrape it must give the catalog exactly."""
    assert catalog_of((FIXTURES / "busy.txt").read_text()) == load_catalog()


def test_histogram_buckets_match_real_vllm() -> None:
    pod = Pod(CONFIG)
    assert buckets_of(pod.page()) == buckets_of((FIXTURES / "busy.txt").read_text())


def test_fresh_page_has_lora_family_without_samples_and_the_sim_load_counter() -> None:
    pod = Pod(CONFIG)
    page = pod.page()
    assert "# TYPE vllm:lora_requests_info gauge" in page
    assert lora_samples(page) == []
    assert "# TYPE vllm_sim:lora_adapter_loads_total counter" in page
    # every vllm: family carries engine="0" and model_name="base" except the documented exceptions
    for family in text_string_to_metric_families(page):
        if family.name.startswith("vllm:") and family.name not in (
            "vllm:lora_requests_info",
            "vllm:cache_config_info",
            "vllm:admission_rejections",
            "vllm:admission_rejections_created",
        ):
            for sample in family.samples:
                assert (sample.labels.get("engine"), sample.labels.get("model_name")) == ("0", "base"), sample


def test_lora_family_absent_when_lora_disabled() -> None:
    pod = Pod(CONFIG, lora_enabled=False)
    assert "vllm:lora_requests_info" not in pod.page()


async def test_lora_requests_info_quirks_identical_labels_and_empty_after_drain() -> None:
    pod = Pod(CONFIG)
    await run_load(pod, [("lora-0", 5), ("lora-1", 5)])
    samples = lora_samples(pod.page())
    combos = {s.labels["running_lora_adapters"] for s in samples}
    assert "lora-0,lora-1" in combos  # joined with "," and no space
    assert all(s.labels["running_lora_adapters"] == s.labels["waiting_lora_adapters"] for s in samples)
    assert all(s.labels["max_lora"] == "2" for s in samples)
    assert newest_lora_adapters(pod.page()) == ""  # drained
    # series are never removed: a later load adds combinations, keeps the old ones
    await run_load(pod, [("lora-2", 3)])
    later = {s.labels["running_lora_adapters"] for s in lora_samples(pod.page())}
    assert combos | {"lora-2"} <= later


async def test_slot_wait_shows_only_as_deferred() -> None:
    pod = Pod(EngineConfig(max_loras=1, max_cpu_loras=1))
    task = asyncio.create_task(pod.driver.run())
    try:
        long_q = pod.driver.submit("lora-0", ["<s>", "x"], 50)[1]
        await long_q.get()  # lora-0 is running
        short_q = pod.driver.submit("lora-1", ["<s>", "y"], 2)[1]
        await long_q.get()  # one more step: the scheduler saw lora-1 blocked
        gauges = {
            (f.name, s.labels.get("reason")): s.value
            for f in text_string_to_metric_families(pod.page())
            for s in f.samples
            if f.name.startswith("vllm:num_requests_")
        }
        assert gauges[("vllm:num_requests_running", None)] == 1
        assert gauges[("vllm:num_requests_waiting", None)] == 1
        assert gauges[("vllm:num_requests_waiting_by_reason", "deferred")] == 1
        assert gauges[("vllm:num_requests_waiting_by_reason", "capacity")] == 0
        assert newest_lora_adapters(pod.page()) == "lora-0"  # the queued lora-1 is invisible
        await asyncio.wait_for(asyncio.gather(finish(long_q), finish(short_q)), timeout=10)
    finally:
        task.cancel()
    loads = {
        s.labels["adapter"]: s.value
        for f in text_string_to_metric_families(pod.page())
        for s in f.samples
        if s.name == "vllm_sim:lora_adapter_loads_total"
    }
    assert loads == {"lora-0": 1.0, "lora-1": 1.0}


async def test_counters_and_histograms_count_requests() -> None:
    pod = Pod(CONFIG)
    await run_load(pod, [(None, 4), (None, 4), ("lora-0", 1)])
    values = {
        (s.name, s.labels.get("finished_reason"), s.labels.get("source")): s.value
        for f in text_string_to_metric_families(pod.page())
        for s in f.samples
    }
    assert values[("vllm:request_success_total", "length", None)] == 3
    assert values[("vllm:generation_tokens_total", None, None)] == 9
    assert values[("vllm:prompt_tokens_total", None, None)] == 3 * 41
    assert values[("vllm:prefix_cache_queries_total", None, None)] == 3 * 41
    # the two base requests are admitted in the same step: neither sees the other's blocks
    assert values[("vllm:prefix_cache_hits_total", None, None)] == 0
    assert values[("vllm:time_to_first_token_seconds_count", None, None)] == 3
    assert values[("vllm:inter_token_latency_seconds_count", None, None)] == 6
    assert values[("vllm:e2e_request_latency_seconds_count", None, None)] == 3


@pytest.mark.parametrize(
    ("block_size", "kv_tokens", "expected"),
    [(16, 65536, ("16", "4096", "65536")), (128, 1048576, ("128", "8192", "1048576"))],
    ids=["default", "like-the-capture"],
)
def test_cache_config_info_reports_geometry(
    block_size: int, kv_tokens: int, expected: tuple[str, str, str]
) -> None:
    pod = Pod(EngineConfig(block_size=block_size, kv_cache_tokens=kv_tokens))
    (sample,) = next(
        f.samples for f in text_string_to_metric_families(pod.page()) if f.name == "vllm:cache_config_info"
    )
    assert sample.value == 1.0
    labels = sample.labels
    assert (labels["block_size"], labels["num_gpu_blocks"], labels["kv_cache_size_tokens"]) == expected


@pytest.mark.parametrize(
    ("lora_enabled", "capture"), [(True, "idle.txt"), (False, "no-lora.txt")], ids=["lora", "no-lora"]
)
def test_families_match_a_real_server_with_the_same_lora_setting(lora_enabled: bool, capture: str) -> None:
    """Same vllm: families and types as real vLLM: idle.txt (--enable-lora, fresh), no-lora.txt (without)."""

    def kinds(page: str) -> dict[str, str]:
        return {name: kind for name, (kind, _, _) in catalog_of(page).items()}

    assert kinds(Pod(CONFIG, lora_enabled=lora_enabled).page()) == kinds((FIXTURES / capture).read_text())
