"""The EPP's own Prometheus metrics, under the names upstream dashboards expect (those of the
Gateway API Inference Extension's EPP).

`EppMetrics` owns every metric in one registry (a fresh one per test, the process default in
`epp serve`). Request metrics are written once per finished stream (`record_stream`), decision
metrics once per scheduling call (`record_decision`, `record_shed`), and the pool and per-endpoint
gauges are read from a datastore snapshot at scrape time by `PoolCollector`, so they are never stale.

Request families are exported twice: `inference_objective_*` (v1.1+) and `inference_model_*`
(v0.3–v1.0), with the same `model_name` / `target_model_name` labels. The hot path writes only the
first; the second is a copy made at scrape time. `labels(...)` costs more than the increment it
leads to, so each label set's children are looked up once and kept (`_Children`).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Generic, TypeVar

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from epp.clock import Clock
from epp.errors import EppError
from epp.picker.datastore.store import Datastore
from epp.picker.datastore.types import Criticality, EndpointState
from epp.picker.lifecycle import RequestLife
from epp.picker.scheduling.types import LLMRequest, SchedulingResult

REQUEST_PREFIXES = ("inference_objective", "inference_model")
MODEL_LABELS = ("model_name", "target_model_name")

# Buckets follow upstream's shapes: seconds for latency, bytes (powers of two) for sizes, tokens.
LATENCY_BUCKETS_S = (
    0.005, 0.025, 0.05, 0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 1.25, 1.5, 2, 3, 4, 5, 6, 8, 10, 15, 20, 30,
    45, 60, 120, 180, 240, 300, 360, 480, 600, 900, 1200, 1800, 2700, 3600,
)  # fmt: skip
TTFT_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
SIZE_BUCKETS_BYTES = tuple(float(2**n) for n in range(6, 31, 2))  # 64 B .. 1 GiB
TOKEN_BUCKETS = tuple(float(2**n) for n in range(0, 18))  # 1 .. 131072 tokens
_Family = TypeVar("_Family", Counter, Gauge, Histogram)

DECISION_BUCKETS_S = (0.0001, 0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0)
# The reasons flow control refuses a request with (`EppError.reason`), as metric label values.
FLOW_REFUSAL_REASONS = frozenset(
    {
        "sheddable",
        "predicted-wait",
        "waited-too-long",
        "queue-full",
        "pool-queue-full",
        "queue-ttl",
        "no-endpoints",
        "shutdown",
    }
)
# Upstream's flow-control queue-duration buckets.
QUEUE_BUCKETS_S = (0.0001, 0.0005, 0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
QUEUE_LABELS = ("fairness_id", "priority", "inference_pool", "model_name", "target_model_name")
# Fairness IDs come from a client header: past this many distinct ones, the rest share one label
# value, so a client cannot grow the metric series without bound.
MAX_FAIRNESS_LABELS = 100
OTHER_FAIRNESS_LABEL = "other"


@dataclass(frozen=True, slots=True)
class RequestOutcome:
    """What `record_stream` needs from one finished request; built from its `RequestLife`."""

    model_name: str  # as the client sent it ("" before the body was read)
    target_model_name: str
    error: EppError | None
    request_body_bytes: int
    response_body_bytes: int
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    duration_s: float | None = None  # request arrival to stream end
    ttft_s: float | None = None  # request arrival to the first response body byte


class _Children(Generic[_Family]):
    """A family's children by label values, each looked up in the family once.

    A child appears in the exposition from its first lookup, so it is looked up only when
    it is about to be written, as a direct `labels(...)` call would.
    """

    __slots__ = ("_children", "_family")
    _family: _Family
    _children: dict[tuple[str, ...], _Family]

    def __init__(self, family: _Family) -> None:
        self._family = family
        self._children = {}

    def __call__(self, *labels: str) -> _Family:
        child = self._children.get(labels)
        if child is None:
            child = self._children[labels] = self._family.labels(*labels)
        return child


class EppMetrics:
    """Every metric the EPP exports, registered in `registry`."""

    def __init__(self, registry: CollectorRegistry, *, pool: str = "") -> None:
        self.registry = registry
        self._pool = pool
        prefix = REQUEST_PREFIXES[0]
        # Only the first prefix is written; `_PrefixMirror` exports the same series under the others.
        self._request_total = Counter(
            f"{prefix}_request_total", "Requests the EPP handled.", MODEL_LABELS, registry=registry
        )
        self._request_errors = Counter(
            f"{prefix}_request_error_total",
            "Requests the EPP answered with an error, by error code.",
            (*MODEL_LABELS, "error_code"),
            registry=registry,
        )
        self._duration = Histogram(
            f"{prefix}_request_duration_seconds",
            "End-to-end request latency seen by the EPP (arrival to end of response).",
            MODEL_LABELS,
            buckets=LATENCY_BUCKETS_S,
            registry=registry,
        )
        self._ttft = Histogram(
            f"{prefix}_request_ttft_seconds",
            "Time from request arrival to the first response body byte.",
            MODEL_LABELS,
            buckets=TTFT_BUCKETS_S,
            registry=registry,
        )
        self._request_sizes = Histogram(
            f"{prefix}_request_sizes",
            "Request body size in bytes.",
            MODEL_LABELS,
            buckets=SIZE_BUCKETS_BYTES,
            registry=registry,
        )
        self._response_sizes = Histogram(
            f"{prefix}_response_sizes",
            "Response body size in bytes.",
            MODEL_LABELS,
            buckets=SIZE_BUCKETS_BYTES,
            registry=registry,
        )
        self._input_tokens = Histogram(
            f"{prefix}_input_tokens",
            "Prompt tokens, from the response's usage.",
            MODEL_LABELS,
            buckets=TOKEN_BUCKETS,
            registry=registry,
        )
        self._output_tokens = Histogram(
            f"{prefix}_output_tokens",
            "Completion tokens, from the response's usage.",
            MODEL_LABELS,
            buckets=TOKEN_BUCKETS,
            registry=registry,
        )
        self._running = Gauge(
            f"{prefix}_running_requests",
            "Requests routed and not yet finished.",
            ("model_name",),
            registry=registry,
        )
        request_families = (
            self._request_total,
            self._request_errors,
            self._duration,
            self._ttft,
            self._request_sizes,
            self._response_sizes,
            self._input_tokens,
            self._output_tokens,
            self._running,
        )
        for other in REQUEST_PREFIXES[1:]:
            registry.register(_PrefixMirror(request_families, prefix, other))
        self._decision_duration = Histogram(
            "inference_extension_scheduler_e2e_duration_seconds",
            "Time the scheduler took to pick endpoints for one request.",
            buckets=DECISION_BUCKETS_S,
            registry=registry,
        )
        self._picks = Counter(
            "inference_extension_scheduler_picks_total",
            "Scheduling decisions by profile and the reason the primary endpoint was picked.",
            ("profile", "reason"),
            registry=registry,
        )
        self._adapter = Counter(
            "inference_extension_adapter_affinity_total",
            "Adapter requests whose primary endpoint already had the adapter active (hit) or not (miss).",
            ("result",),
            registry=registry,
        )
        self._shed = Counter(
            "inference_extension_requests_shed_total",
            "Requests refused by admission control, by criticality.",
            ("criticality",),
            registry=registry,
        )
        self._flow_refused = Counter(
            "lora_epp_flow_control_refused_total",
            "Requests flow control refused, by priority band and reason: sheddable (the pool is "
            "saturated), predicted-wait (on arrival: it could not be dispatched within the queue wait "
            "target), waited-too-long (while waiting), queue-full, pool-queue-full, queue-ttl, "
            "no-endpoints, shutdown.",
            ("priority", "reason"),
            registry=registry,
        )
        self._finished_by = Counter(
            "inference_extension_request_finished_total",
            "Routed requests by what told the EPP they had finished: their response passing through "
            "(response), the gateway's access log (access-log), the end of their stream with no access "
            "log coming (stream-end), or an access-log entry that never came (expired).",
            ("source",),
            registry=registry,
        )
        self._queue_size = Gauge(
            "inference_extension_flow_control_queue_size",
            "Requests waiting in flow control, by flow (fairness ID and priority) and model.",
            QUEUE_LABELS,
            registry=registry,
        )
        self._queue_bytes = Gauge(
            "inference_extension_flow_control_queue_bytes",
            "Request body bytes waiting in flow control, by flow and model.",
            QUEUE_LABELS,
            registry=registry,
        )
        self._queue_duration = Histogram(
            "inference_extension_flow_control_request_queue_duration_seconds",
            "Time a request spent in flow control, from enqueue to its outcome (Dispatched, "
            "RejectedCapacity, EvictedTTL, EvictedContextCancelled, EvictedNoEndpoints, EvictedOther).",
            ("fairness_id", "priority", "outcome", "inference_pool", "model_name", "target_model_name"),
            buckets=QUEUE_BUCKETS_S,
            registry=registry,
        )
        self._fairness_labels: set[str] = set()
        self._total_of = _Children(self._request_total)
        self._errors_of = _Children(self._request_errors)
        self._request_sizes_of = _Children(self._request_sizes)
        self._response_sizes_of = _Children(self._response_sizes)
        self._input_tokens_of = _Children(self._input_tokens)
        self._output_tokens_of = _Children(self._output_tokens)
        self._duration_of = _Children(self._duration)
        self._ttft_of = _Children(self._ttft)
        self._running_of = _Children(self._running)
        self._picks_of = _Children(self._picks)
        self._adapter_of = _Children(self._adapter)
        self._finished_by_of = _Children(self._finished_by)

    # -- request path ----------------------------------------------------------------------

    def record_stream(self, outcome: RequestOutcome) -> None:
        """One finished ext_proc stream: totals, errors, sizes, tokens and latencies."""
        labels = (outcome.model_name, outcome.target_model_name)
        self._total_of(*labels).inc()
        if outcome.error is not None:
            self._errors_of(*labels, outcome.error.code.wire_name).inc()
        self._request_sizes_of(*labels).observe(outcome.request_body_bytes)
        if outcome.error is None:
            self._response_sizes_of(*labels).observe(outcome.response_body_bytes)
        if outcome.prompt_tokens:
            self._input_tokens_of(*labels).observe(outcome.prompt_tokens)
        if outcome.completion_tokens:
            self._output_tokens_of(*labels).observe(outcome.completion_tokens)
        if outcome.duration_s is not None:
            self._duration_of(*labels).observe(max(0.0, outcome.duration_s))
        if outcome.ttft_s is not None:
            self._ttft_of(*labels).observe(max(0.0, outcome.ttft_s))

    def record_finished_by(self, source: str) -> None:
        self._finished_by_of(source).inc()

    def request_started(self, model_name: str) -> None:
        self._running_of(model_name).inc()

    def request_finished(self, model_name: str) -> None:
        self._running_of(model_name).dec()

    # -- decisions -------------------------------------------------------------------------

    def record_decision(self, request: LLMRequest, result: SchedulingResult, duration_s: float) -> None:
        """One scheduling call that picked endpoints."""
        self._decision_duration.observe(max(0.0, duration_s))
        self._picks_of(result.profile, result.reason or "unspecified").inc()
        hit = adapter_hit(request, result)
        if hit is not None:
            self._adapter_of("hit" if hit else "miss").inc()

    def record_scheduling_failure(self, duration_s: float) -> None:
        """A scheduling call that raised (no endpoint could serve): still a timed decision."""
        self._decision_duration.observe(max(0.0, duration_s))

    def record_shed(self, criticality: Criticality) -> None:
        self._shed.labels(criticality.value).inc()

    def record_flow_refusal(self, priority: int, reason: str) -> None:
        """A request flow control refused (reasons are the bounded set the counter's help names)."""
        self._flow_refused.labels(str(priority), reason if reason in FLOW_REFUSAL_REASONS else "other").inc()

    # -- flow control ----------------------------------------------------------------------

    def queue_entered(self, life: RequestLife) -> None:
        labels = self._queue_labels(life)
        self._queue_size.labels(*labels).inc()
        self._queue_bytes.labels(*labels).inc(life.outcome.request_body_bytes)

    def queue_left(self, life: RequestLife, outcome: str, now: float) -> None:
        """`life` left its queue (or was refused at its door: it never counted as queued)."""
        labels = self._queue_labels(life)
        fairness_id, priority, pool, model, target = labels
        if life.queued_at is not None:
            self._queue_size.labels(*labels).dec()
            self._queue_bytes.labels(*labels).dec(life.outcome.request_body_bytes)
        waited = 0.0 if life.queued_at is None else max(0.0, now - life.queued_at)
        self._queue_duration.labels(fairness_id, priority, outcome, pool, model, target).observe(waited)

    def _queue_labels(self, life: RequestLife) -> tuple[str, str, str, str, str]:
        fairness_id = life.fairness_id
        if fairness_id not in self._fairness_labels:
            if len(self._fairness_labels) < MAX_FAIRNESS_LABELS:
                self._fairness_labels.add(fairness_id)
            else:
                fairness_id = OTHER_FAIRNESS_LABEL
        model, target = life.models
        return (fairness_id, str(life.priority), self._pool, model, target)


def adapter_hit(request: LLMRequest, result: SchedulingResult) -> bool | None:
    """Whether the primary endpoint already had the requested adapter active; None for base models.

    A request targets an adapter when its target model is not the endpoint's served base model.
    Without metrics for the primary endpoint the answer is unknown (None).
    """
    if not result.endpoints or not request.target_model:
        return None
    metrics = result.primary.metrics
    if metrics is None:
        return None
    if metrics.served_model_name is not None and request.target_model == metrics.served_model_name:
        return None
    if not metrics.lora_enabled and metrics.served_model_name is None:
        return None
    return request.target_model in metrics.active_adapters


class _PrefixMirror(Collector):
    """The request families again under another name prefix, read at scrape time.

    One write per request instead of one per prefix; both names always show the same values.
    """

    def __init__(
        self, families: tuple[Counter | Gauge | Histogram, ...], prefix: str, mirror_prefix: str
    ) -> None:
        self._families = families
        self._prefix = prefix
        self._mirror_prefix = mirror_prefix

    def describe(self) -> Iterator[Metric]:
        return iter(())  # unchecked collector: the names are checked on the written families

    def collect(self) -> Iterator[Metric]:
        for family in self._families:
            for metric in family.collect():
                mirror = Metric(self._renamed(metric.name), metric.documentation, metric.type, metric.unit)
                mirror.samples = [
                    sample._replace(name=self._renamed(sample.name)) for sample in metric.samples
                ]
                yield mirror

    def _renamed(self, name: str) -> str:
        return self._mirror_prefix + name.removeprefix(self._prefix)


class PoolCollector(Collector):
    """Pool and per-endpoint gauges computed from the datastore at scrape time.

    Averages follow upstream: average KV = Σkv / n and average queue = integer Σwaiting / n over
    endpoints with metrics; `ready_pods` counts every endpoint in the snapshot.
    """

    def __init__(self, datastore: Datastore, clock: Clock) -> None:
        self._datastore = datastore
        self._clock = clock

    def describe(self) -> Iterator[Metric]:
        return iter(())  # unchecked collector: families depend on the pool

    def collect(self) -> Iterator[Metric]:
        snapshot = self._datastore.snapshot()
        pool = snapshot.pool.name if snapshot.pool is not None else ""
        now = self._clock.now()
        yield from pool_families(pool, snapshot.endpoints, now)


def pool_families(pool: str, endpoints: tuple[EndpointState, ...], now: float) -> Iterator[Metric]:
    ready = GaugeMetricFamily("inference_pool_ready_pods", "Endpoints in the pool.", labels=("name",))
    kv = GaugeMetricFamily(
        "inference_pool_average_kv_cache_utilization",
        "Mean KV-cache utilisation (0..1) over endpoints with metrics.",
        labels=("name",),
    )
    queue = GaugeMetricFamily(
        "inference_pool_average_queue_size",
        "Mean waiting requests per endpoint (integer division, as upstream).",
        labels=("name",),
    )
    running = GaugeMetricFamily(
        "inference_pool_average_running_requests",
        "Mean running requests per endpoint.",
        labels=("name",),
    )
    per_pod_queue = GaugeMetricFamily(
        "inference_pool_per_pod_queue_size",
        "Waiting requests per endpoint.",
        labels=("name", "model_server_pod"),
    )
    failures = GaugeMetricFamily(
        "inference_extension_endpoint_scrape_consecutive_failures",
        "Consecutive failed metric scrapes per endpoint (0 after a success).",
        labels=("name", "endpoint"),
    )
    age = GaugeMetricFamily(
        "inference_extension_endpoint_metrics_age_seconds",
        "Seconds since the endpoint's newest successful scrape (-1 before the first).",
        labels=("name", "endpoint"),
    )
    with_metrics = [state for state in endpoints if state.metrics is not None]
    ready.add_metric([pool], len(endpoints))
    if with_metrics:
        count = len(with_metrics)
        kv.add_metric([pool], sum(s.metrics.kv_cache_usage for s in with_metrics if s.metrics) / count)
        queue.add_metric([pool], sum(s.metrics.waiting_requests for s in with_metrics if s.metrics) // count)
        running.add_metric([pool], sum(s.metrics.running_requests for s in with_metrics if s.metrics) / count)
    for state in endpoints:
        failures.add_metric([pool, state.name], state.scrape_failures)
        if state.metrics is None:
            age.add_metric([pool, state.name], -1.0)
            continue
        per_pod_queue.add_metric([pool, state.name], state.metrics.waiting_requests)
        age.add_metric([pool, state.name], max(0.0, now - state.metrics.updated_at))
    yield from (ready, kv, queue, running, per_pod_queue, failures, age)
