"""Pool gauges read from the datastore at scrape time, and the adapter hit/miss rule."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from epp.clock import FakeClock
from epp.errors import EppError, ErrorCode
from epp.picker.datastore.types import Endpoint, EndpointState, Metrics
from epp.picker.observability.metrics import EppMetrics, PoolCollector, RequestOutcome, adapter_hit
from epp.picker.scheduling.types import LLMRequest, SchedulingResult
from tests.support.fake_scheduler import pool_datastore

POOL = {"name": "pool"}


def test_pool_gauges_average_over_endpoints_with_metrics() -> None:
    clock = FakeClock()
    store = pool_datastore(("10.0.0.1", "10.0.0.2", "10.0.0.3"), clock=clock)
    registry = CollectorRegistry()
    registry.register(PoolCollector(store, clock))
    store.update_metrics(
        "pod-0-rank-0", Metrics(updated_at=clock.now(), waiting_requests=3, kv_cache_usage=0.5)
    )
    store.update_metrics(
        "pod-1-rank-0", Metrics(updated_at=clock.now(), waiting_requests=4, kv_cache_usage=0.3)
    )
    clock.advance(1.5)
    store.record_scrape_failure("pod-1-rank-0", "timeout")
    assert registry.get_sample_value("inference_pool_ready_pods", POOL) == 3
    assert registry.get_sample_value("inference_pool_average_kv_cache_utilization", POOL) == pytest.approx(
        0.4
    )
    assert registry.get_sample_value("inference_pool_average_queue_size", POOL) == 3  # 7 // 2, as upstream
    per_pod = {"name": "pool", "model_server_pod": "pod-1-rank-0"}
    assert registry.get_sample_value("inference_pool_per_pod_queue_size", per_pod) == 4
    failures = "inference_extension_endpoint_scrape_consecutive_failures"
    assert registry.get_sample_value(failures, {"name": "pool", "endpoint": "pod-1-rank-0"}) == 1
    assert registry.get_sample_value(failures, {"name": "pool", "endpoint": "pod-0-rank-0"}) == 0
    age = "inference_extension_endpoint_metrics_age_seconds"
    assert registry.get_sample_value(age, {"name": "pool", "endpoint": "pod-0-rank-0"}) == 1.5
    assert registry.get_sample_value(age, {"name": "pool", "endpoint": "pod-2-rank-0"}) == -1


def test_pool_without_metrics_exports_only_counts() -> None:
    clock = FakeClock()
    store = pool_datastore(clock=clock)
    registry = CollectorRegistry()
    registry.register(PoolCollector(store, clock))
    assert registry.get_sample_value("inference_pool_ready_pods", POOL) == 2
    assert registry.get_sample_value("inference_pool_average_kv_cache_utilization", POOL) is None


def test_all_metric_families_render_in_text_format() -> None:
    registry = CollectorRegistry()
    EppMetrics(registry)
    text = generate_latest(registry).decode()
    for name in (
        "inference_objective_request_total",
        "inference_model_request_total",
        "inference_extension_scheduler_e2e_duration_seconds",
        "inference_extension_requests_shed_total",
    ):
        assert f"# TYPE {name}" in text


def state(metrics: Metrics | None) -> EndpointState:
    return EndpointState(Endpoint("pod-0-rank-0", "pod-0", "default", "10.0.0.1", 8000), metrics=metrics)


LORA = dict(lora_enabled=True, max_lora=2, served_model_name="base")


@pytest.mark.parametrize(
    ("target", "metrics", "expected"),
    [
        ("a1", Metrics(updated_at=0, running_adapters=frozenset({"a1"}), **LORA), True),  # type: ignore[arg-type]
        ("a1", Metrics(updated_at=0, waiting_adapters=frozenset({"a1"}), **LORA), True),  # type: ignore[arg-type]
        ("a2", Metrics(updated_at=0, running_adapters=frozenset({"a1"}), **LORA), False),  # type: ignore[arg-type]
        ("base", Metrics(updated_at=0, **LORA), None),  # type: ignore[arg-type]
        ("a1", None, None),
        ("m", Metrics(updated_at=0), None),
    ],
    ids=["running", "waiting", "miss", "base-model", "no-metrics", "no-lora-info"],
)
def test_adapter_hit(target: str, metrics: Metrics | None, expected: bool | None) -> None:
    request = LLMRequest(request_id="r", incoming_model=target, target_model=target)
    assert adapter_hit(request, SchedulingResult(endpoints=(state(metrics),))) is expected


def test_both_request_prefixes_report_the_same_values() -> None:
    registry = CollectorRegistry()
    metrics = EppMetrics(registry)
    metrics.record_stream(RequestOutcome("m", "a1", None, 100, 300, prompt_tokens=5, duration_s=0.2))
    metrics.record_stream(
        RequestOutcome("m", "a1", EppError(ErrorCode.BAD_REQUEST, "bad", reason="bad-json"), 10, 0)
    )
    metrics.request_started("a1")
    labels = {"model_name": "m", "target_model_name": "a1"}
    for prefix in ("inference_objective", "inference_model"):
        assert registry.get_sample_value(f"{prefix}_request_total", labels) == 2
        errors = {**labels, "error_code": "BadRequest"}
        assert registry.get_sample_value(f"{prefix}_request_error_total", errors) == 1
        assert registry.get_sample_value(f"{prefix}_request_sizes_sum", labels) == 110
        assert registry.get_sample_value(f"{prefix}_input_tokens_count", labels) == 1
        assert registry.get_sample_value(f"{prefix}_running_requests", {"model_name": "a1"}) == 1
    text = generate_latest(registry).decode()
    assert "# TYPE inference_model_request_duration_seconds histogram" in text


def test_a_series_appears_only_once_it_is_written() -> None:
    registry = CollectorRegistry()
    metrics = EppMetrics(registry)
    metrics.record_stream(RequestOutcome("m", "a1", None, 100, 300))
    text = generate_latest(registry).decode()
    assert 'inference_objective_request_sizes_count{model_name="m",target_model_name="a1"} 1.0' in text
    assert "inference_objective_input_tokens_count{" not in text  # no usage: no token series
    assert "inference_model_request_ttft_seconds_count{" not in text
