"""Metrics, the decision log and trace spans, driven through the real director and stream handler.

The `Observer` is the director's `DecisionObserver`: it hears each decision, refusal, queue entry
and exit and each finish, and turns them into what operators see.
"""

from __future__ import annotations

import json
import random
from collections.abc import Mapping, Sequence

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client import CollectorRegistry

from epp._proto.envoy.config.core.v3 import base_pb2
from epp._proto.envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from epp.clock import FakeClock
from epp.errors import EppError, ErrorCode
from epp.picker.admission import build_admission
from epp.picker.datastore.types import (
    Criticality,
    EndpointState,
    InferenceModel,
    InferenceObjective,
    Snapshot,
)
from epp.picker.director import Director, admit_all
from epp.picker.extproc.stream import StreamHandler, StreamOptions
from epp.picker.flowcontrol import FlowControlSettings, build_flow_control
from epp.picker.flowcontrol.overload import OverloadSettings
from epp.picker.flowcontrol.settings import BandSettings
from epp.picker.lifecycle import Ending, KeyMint, RequestLife, Stage
from epp.picker.observability.decisions import DecisionLog
from epp.picker.observability.metrics import MAX_FAIRNESS_LABELS, OTHER_FAIRNESS_LABEL, EppMetrics
from epp.picker.observability.observer import Observer
from epp.picker.scheduling.build import build_scheduler_from_config
from epp.picker.scheduling.picker_config import load_config
from epp.picker.scheduling.policies import policy_config_text
from epp.picker.scheduling.types import LLMRequest, Scheduler
from tests.support.fake_scheduler import FakeScheduler, pool_datastore, scrape_lora_slots

PARENT_TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
TRACEPARENT = f"00-{PARENT_TRACE_ID}-00f067aa0ba902b7-01"


def shed_sheddable(
    request: LLMRequest, candidates: Sequence[EndpointState], snapshot: Snapshot, now: float
) -> None:
    if request.sheddable:
        raise EppError(ErrorCode.RESOURCE_EXHAUSTED, "system saturated", reason="saturated")


def header_map(headers: Mapping[str, str]) -> base_pb2.HeaderMap:
    return base_pb2.HeaderMap(
        headers=[base_pb2.HeaderValue(key=k, raw_value=v.encode()) for k, v in headers.items()]
    )


class Harness:
    def __init__(
        self,
        *,
        exhausted: bool = False,
        shed: bool = False,
        scheduler: Scheduler | None = None,
        models: Sequence[InferenceModel] = (),
    ) -> None:
        self.clock = FakeClock()
        self.registry = CollectorRegistry()
        self.exporter = InMemorySpanExporter()
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(self.exporter))
        self.decisions = DecisionLog(capacity=4)
        self.observer = Observer(
            EppMetrics(self.registry), self.decisions, self.clock, tracer=provider.get_tracer("test")
        )
        self.director = Director(
            pool_datastore(models=models, clock=self.clock),
            scheduler or FakeScheduler(exhausted=exhausted),
            admit=shed_sheddable if shed else admit_all,
            clock=self.clock,
            rng=random.Random(1),
            observer=self.observer,
        )

    def request(
        self,
        body: bytes,
        *,
        request_id: str = "r1",
        headers: dict[str, str] | None = None,
        response: bytes | None = b'{"usage":{"prompt_tokens":7,"completion_tokens":3,"total_tokens":10}}',
        advance_s: float = 0.25,
    ) -> StreamHandler:
        handler = StreamHandler(StreamOptions(self.director, clock=self.clock))
        all_headers = {":method": "POST", "x-request-id": request_id, **(headers or {})}
        handler.handle(pb.ProcessingRequest(request_headers=pb.HttpHeaders(headers=header_map(all_headers))))
        handler.handle(pb.ProcessingRequest(request_body=pb.HttpBody(body=body, end_of_stream=True)))
        if response is not None and not handler.done:
            status = pb.HttpHeaders(
                headers=header_map({":status": "200", "content-type": "application/json"})
            )
            handler.handle(pb.ProcessingRequest(response_headers=status))
            self.clock.advance(advance_s)
            handler.handle(pb.ProcessingRequest(response_body=pb.HttpBody(body=response, end_of_stream=True)))
        handler.close()
        return handler

    def sample(self, name: str, **labels: str) -> float | None:
        return self.registry.get_sample_value(name, labels)


MODEL = {"model_name": "m", "target_model_name": "m"}


@pytest.mark.parametrize("prefix", ["inference_objective", "inference_model"], ids=["v1.1", "v1.0"])
def test_a_served_request_counts_sizes_tokens_and_latency(prefix: str) -> None:
    h = Harness()
    body = b'{"model":"m","prompt":"hello"}'
    h.request(body)
    assert h.sample(f"{prefix}_request_total", **MODEL) == 1
    assert h.sample(f"{prefix}_request_sizes_sum", **MODEL) == len(body)
    assert h.sample(f"{prefix}_input_tokens_sum", **MODEL) == 7
    assert h.sample(f"{prefix}_output_tokens_sum", **MODEL) == 3
    assert h.sample(f"{prefix}_request_duration_seconds_sum", **MODEL) == pytest.approx(0.25)
    assert h.sample(f"{prefix}_request_ttft_seconds_sum", **MODEL) == pytest.approx(0.25)
    assert h.sample(f"{prefix}_running_requests", model_name="m") == 0
    assert h.sample(f"{prefix}_request_error_total", **MODEL, error_code="BadRequest") is None
    assert h.sample("inference_extension_request_finished_total", source="response") == 1


@pytest.mark.parametrize(
    ("body", "error_code", "reason"),
    [
        (b"{not json", "BadRequest", "bad-json"),
        (b'{"prompt":"no model"}', "BadRequest", "no-model"),
    ],
    ids=["bad-json", "no-model"],
)
def test_a_refused_request_counts_an_error_and_is_logged(body: bytes, error_code: str, reason: str) -> None:
    h = Harness()
    handler = h.request(body, request_id="bad")
    labels = {"model_name": "", "target_model_name": ""}
    assert h.sample("inference_objective_request_error_total", **labels, error_code=error_code) == 1
    [entry] = h.decisions.recent()
    assert (entry.request_id, entry.outcome, entry.reason, entry.response_status) == (
        "bad",
        "error",
        reason,
        400,
    )
    assert handler.life is not None and entry.key == handler.life.key


def test_a_decision_is_logged_with_candidates_choice_and_status() -> None:
    h = Harness()
    handler = h.request(b'{"model":"m","prompt":"x"}', request_id="r7")
    [entry] = h.decisions.recent()
    assert entry.outcome == "routed"
    assert entry.candidates == ("pod-0-rank-0", "pod-1-rank-0")
    assert entry.chosen == ("10.0.0.1:8000",)
    assert entry.reason == "fake"
    assert entry.response_status == 200
    assert (entry.request_id, entry.queue_wait_s) == ("r7", None)  # it never queued
    assert handler.life is not None and entry.key == handler.life.key
    assert h.sample("inference_extension_scheduler_picks_total", profile="default", reason="fake") == 1
    assert h.sample("inference_extension_scheduler_e2e_duration_seconds_count") == 1


def test_an_adapters_decision_names_the_plans_homes_in_the_log_and_the_span() -> None:
    text = policy_config_text("default")
    assert text is not None
    config = load_config(text)
    scheduler = build_scheduler_from_config(config, seed=1, name="default")
    h = Harness(scheduler=scheduler)
    h.request(b'{"model":"sql-lora","prompt":"x"}', request_id="p1", headers={"traceparent": TRACEPARENT})
    [entry] = h.decisions.recent()
    [home] = entry.planned_homes  # one home: the adapter has no traffic share yet
    assert home in entry.candidates
    assert entry.reason == "planned-free-slot"
    assert json.loads(json.dumps(entry.to_json()))["planned_homes"] == [home]
    [span] = h.exporter.get_finished_spans()
    assert span.attributes is not None
    assert list(span.attributes["epp.planned_homes"]) == [home]  # type: ignore[arg-type]


def test_shedding_is_counted_by_criticality_and_traced() -> None:
    models = [
        InferenceModel(name="m", namespace="default", model_name="m", pool_name="pool"),
        InferenceModel(
            name="s", namespace="default", model_name="s", pool_name="pool", criticality=Criticality.SHEDDABLE
        ),
    ]
    h = Harness(shed=True, models=models)
    h.request(b'{"model":"m","prompt":"x"}', request_id="s1", headers={"traceparent": TRACEPARENT})
    assert h.sample("inference_extension_requests_shed_total", criticality="Sheddable") is None
    assert h.decisions.recent()[0].outcome == "routed"
    h.request(b'{"model":"s","prompt":"x"}', request_id="s2", headers={"traceparent": TRACEPARENT})
    assert h.sample("inference_extension_requests_shed_total", criticality="Sheddable") == 1
    shed_span = h.exporter.get_finished_spans()[-1]
    assert shed_span.attributes is not None
    assert shed_span.attributes["epp.shed_reason"] == "saturated"
    entry = h.decisions.recent()[0]
    assert (entry.request_id, entry.outcome, entry.response_status) == ("s2", "shed", 429)
    labels = {"model_name": "s", "target_model_name": "s", "error_code": "InferencePoolResourceExhausted"}
    assert h.sample("inference_objective_request_error_total", **labels) == 1


def test_no_pick_is_logged_and_the_decision_still_timed() -> None:
    h = Harness(exhausted=True)
    h.request(b'{"model":"m","prompt":"x"}', request_id="x1")
    [entry] = h.decisions.recent()
    assert (entry.outcome, entry.error_code) == ("no-endpoint", "InferencePoolResourceExhausted")
    assert h.sample("inference_extension_scheduler_e2e_duration_seconds_count") == 1
    labels = {**MODEL, "error_code": "InferencePoolResourceExhausted"}
    assert h.sample("inference_objective_request_error_total", **labels) == 1


def test_the_decision_span_joins_the_callers_trace_and_carries_scores() -> None:
    h = Harness()
    h.request(b'{"model":"m","prompt":"x"}', request_id="t1", headers={"traceparent": TRACEPARENT})
    [span] = h.exporter.get_finished_spans()
    assert format(span.context.trace_id, "032x") == PARENT_TRACE_ID
    assert span.parent is not None and format(span.parent.span_id, "016x") == "00f067aa0ba902b7"
    attributes = span.attributes
    assert attributes is not None
    assert attributes["epp.model"] == "m"
    assert list(attributes["epp.candidates"]) == ["pod-0-rank-0", "pod-1-rank-0"]  # type: ignore[arg-type]
    assert attributes["epp.destination"] == "10.0.0.1:8000"
    assert json.loads(str(attributes["epp.scores"])) == {}


def test_trace_headers_name_the_decision_span_on_the_requests_own_life() -> None:
    h = Harness()
    life = h.director.mint("open")
    h.director.arrive(life, headers={"traceparent": TRACEPARENT}, body=b'{"model":"m"}')
    [(name, value)] = life.upstream_headers
    span = h.exporter.get_finished_spans()[0]
    assert name == "traceparent"
    assert value == f"00-{PARENT_TRACE_ID}-{span.context.span_id:016x}-01"
    assert h.director.mint("other").upstream_headers == []  # another request's life holds none


def test_without_a_tracer_no_trace_headers_are_set() -> None:
    observer = Observer(EppMetrics(CollectorRegistry()), DecisionLog(), FakeClock())
    director = Director(pool_datastore(), FakeScheduler(), clock=FakeClock(), observer=observer)
    life = director.mint("q")
    director.arrive(life, headers={"traceparent": TRACEPARENT}, body=b'{"model":"m"}')
    assert life.upstream_headers == []
    assert life.decision_logged and observer.decisions.recent()[0].outcome == "routed"


def test_the_decision_log_is_bounded() -> None:
    h = Harness()
    for index in range(10):
        h.request(b'{"model":"m"}', request_id=f"r{index}")
    assert [d.request_id for d in h.decisions.recent()] == ["r9", "r8", "r7", "r6"]


def test_streams_sharing_a_client_request_id_are_each_accounted() -> None:
    h = Harness()
    handlers = []
    for _ in range(2):
        handler = StreamHandler(StreamOptions(h.director, clock=h.clock))
        handler.handle(
            pb.ProcessingRequest(
                request_headers=pb.HttpHeaders(
                    headers=header_map({"x-request-id": "same", "traceparent": TRACEPARENT})
                )
            )
        )
        handler.handle(
            pb.ProcessingRequest(request_body=pb.HttpBody(body=b'{"model":"m"}', end_of_stream=True))
        )
        handlers.append(handler)
    lives = [handler.life for handler in handlers]
    assert lives[0] is not None and lives[1] is not None
    assert h.sample("inference_objective_running_requests", model_name="m") == 2
    handlers[0].handle(
        pb.ProcessingRequest(response_headers=pb.HttpHeaders(headers=header_map({":status": "503"})))
    )
    handlers[0].close()
    assert h.sample("inference_objective_running_requests", model_name="m") == 1
    assert lives[1].upstream_headers  # the other stream keeps its own
    assert lives[0].upstream_headers != lives[1].upstream_headers  # one span each
    handlers[1].handle(
        pb.ProcessingRequest(response_headers=pb.HttpHeaders(headers=header_map({":status": "200"})))
    )
    handlers[1].close()
    assert h.sample("inference_objective_running_requests", model_name="m") == 0
    # Each decision gets its own status, by its request's key, though the clients' ids are the same.
    by_key = {entry.key: entry.response_status for entry in h.decisions.recent()}
    assert by_key == {lives[0].key: 503, lives[1].key: 200}


def test_a_request_finished_twice_is_counted_once() -> None:
    h = Harness()
    life = h.director.mint("once")
    h.director.arrive(life, headers={}, body=b'{"model":"m"}')
    life.outcome.status = 200
    assert life.finish(Ending.ACCESS_LOG, h.clock.now())
    assert not life.finish(Ending.STREAM_END, h.clock.now())
    assert h.sample("inference_objective_request_total", **MODEL) == 1
    assert h.sample("inference_objective_running_requests", model_name="m") == 0
    assert h.sample("inference_extension_request_finished_total", source="access-log") == 1
    assert h.sample("inference_extension_request_finished_total", source="stream-end") is None


# -- flow control ----------------------------------------------------------------------------

QUEUE_SIZE = "inference_extension_flow_control_queue_size"
QUEUE_BYTES = "inference_extension_flow_control_queue_bytes"
QUEUE_DURATION = "inference_extension_flow_control_request_queue_duration_seconds"
RUNNING = "inference_objective_running_requests"
BODY = b'{"model":"base"}'


class FlowHarness:
    """A director with flow control and the observer, over pods whose scrapes say how full they are."""

    def __init__(self, settings: FlowControlSettings | None = None) -> None:
        self.clock = FakeClock()
        self.registry = CollectorRegistry()
        self.exporter = InMemorySpanExporter()
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(self.exporter))
        self.decisions = DecisionLog()
        self.observer = Observer(
            EppMetrics(self.registry, pool="pool"),
            self.decisions,
            self.clock,
            tracer=provider.get_tracer("test"),
        )
        self.store = pool_datastore(clock=self.clock)
        self.scheduler = FakeScheduler()
        flow = build_flow_control(
            settings or FlowControlSettings(enabled=True), self.scheduler.state, build_admission().detector
        )
        self.director = Director(
            self.store,
            self.scheduler,
            flow=flow,
            clock=self.clock,
            observer=self.observer,
            keys=KeyMint("t"),
        )
        self.told: list[RequestLife] = []

    def scrape(self, *, waiting: int) -> None:
        """Every pod scraped now; `waiting` over the saturation threshold (5) leaves no headroom.
        A pod with a queue runs a full batch (256); without one, an empty one, so what was queued
        here can all start there."""
        scrape_lora_slots(self.store, self.clock.now(), waiting=waiting, running=256 if waiting else 0)

    def send(self, fairness_id: str = "tenant-a") -> RequestLife:
        life = self.director.mint()
        life.waiter = self.told.append
        self.director.arrive(life, headers={"x-gateway-inference-fairness-id": fairness_id}, body=BODY)
        return life

    def sample(self, name: str, **labels: str) -> float | None:
        return self.registry.get_sample_value(name, labels)

    def queue_labels(self, fairness_id: str = "tenant-a") -> dict[str, str]:
        return {
            "fairness_id": fairness_id,
            "priority": "0",
            "inference_pool": "pool",
            "model_name": "base",
            "target_model_name": "base",
        }

    def waited(self, outcome: str, fairness_id: str = "tenant-a") -> tuple[float | None, float | None]:
        """(count, sum) of the queue-duration histogram for `outcome`."""
        labels = {**self.queue_labels(fairness_id), "outcome": outcome}
        return self.sample(f"{QUEUE_DURATION}_count", **labels), self.sample(
            f"{QUEUE_DURATION}_sum", **labels
        )


def test_a_queued_request_counts_in_the_queue_until_it_is_dispatched() -> None:
    h = FlowHarness()
    h.scrape(waiting=10)
    life = h.send()
    assert life.stage is Stage.QUEUED
    assert h.sample(QUEUE_SIZE, **h.queue_labels()) == 1
    assert h.sample(QUEUE_BYTES, **h.queue_labels()) == len(BODY)
    assert (h.sample(RUNNING, model_name="base") or 0) == 0  # waiting is not running
    assert h.decisions.recent() == []  # no decision yet
    h.clock.advance(0.5)
    h.scrape(waiting=0)
    h.director.pump()
    assert h.told == [life]
    assert h.sample(QUEUE_SIZE, **h.queue_labels()) == 0
    assert h.sample(QUEUE_BYTES, **h.queue_labels()) == 0
    count, waited = h.waited("Dispatched")
    assert count == 1 and waited == pytest.approx(0.5)
    assert h.sample(RUNNING, model_name="base") == 1
    [entry] = h.decisions.recent()
    assert (entry.outcome, entry.key) == ("routed", life.key)
    assert entry.queue_wait_s == pytest.approx(0.5)
    life.outcome.status = 200
    life.finish(Ending.RESPONSE, h.clock.now())
    assert h.sample(RUNNING, model_name="base") == 0
    assert h.decisions.recent()[0].response_status == 200


def test_a_request_that_times_out_in_the_queue_is_a_503_and_never_runs() -> None:
    h = FlowHarness(FlowControlSettings(enabled=True, request_ttl_s=2.0))
    h.scrape(waiting=10)
    served = h.director.mint()
    h.scrape(waiting=0)
    h.director.arrive(served, headers={}, body=BODY)  # one dispatched, so the running series exists
    served.finish(Ending.RESPONSE, h.clock.now())
    h.scrape(waiting=10)
    life = h.send()
    h.clock.advance(2.0)
    h.scrape(waiting=10)  # fresh and still full
    h.director.pump()
    assert h.told == [life] and life.error is not None
    life.finish(Ending.REFUSED, h.clock.now())
    assert h.sample(QUEUE_SIZE, **h.queue_labels()) == 0
    count, waited = h.waited("EvictedTTL")
    assert count == 1 and waited == pytest.approx(2.0)
    assert h.waited("Dispatched") == (None, None)
    assert h.sample(RUNNING, model_name="base") == 0
    labels = {"model_name": "base", "target_model_name": "base", "error_code": "ServiceUnavailable"}
    assert h.sample("inference_objective_request_error_total", **labels) == 1
    entry = h.decisions.recent()[0]
    assert (entry.key, entry.outcome, entry.error_code, entry.response_status) == (
        life.key,
        "queue-EvictedTTL",
        "ServiceUnavailable",
        503,
    )
    assert entry.queue_wait_s == pytest.approx(2.0)
    refusal = h.exporter.get_finished_spans()[-1]
    assert refusal.attributes is not None and refusal.attributes["epp.error_code"] == "ServiceUnavailable"


def test_a_client_that_leaves_while_queued_is_counted_as_cancelled() -> None:
    h = FlowHarness()
    h.scrape(waiting=10)
    life = h.send()
    h.clock.advance(0.75)
    life.finish(Ending.CLIENT_GONE, h.clock.now())
    assert h.sample(QUEUE_SIZE, **h.queue_labels()) == 0
    count, waited = h.waited("EvictedContextCancelled")
    assert count == 1 and waited == pytest.approx(0.75)
    assert (h.sample(RUNNING, model_name="base") or 0) == 0
    assert h.sample("inference_objective_request_total", model_name="base", target_model_name="base") == 1
    assert (
        h.sample("inference_extension_request_finished_total", source="client-gone") is None
    )  # never routed
    h.scrape(waiting=0)
    h.director.pump()
    assert h.told == [] and h.scheduler.scheduled == []


def test_a_request_refused_at_a_full_queue_is_counted_as_rejected() -> None:
    h = FlowHarness(FlowControlSettings(enabled=True, default_band=BandSettings(max_requests=1)))
    h.scrape(waiting=10)
    h.send()
    late = h.director.mint()
    with pytest.raises(EppError) as caught:
        h.director.arrive(late, headers={"x-gateway-inference-fairness-id": "tenant-a"}, body=BODY)
    late.refuse(caught.value)
    late.finish(Ending.REFUSED, h.clock.now())
    assert h.sample(QUEUE_SIZE, **h.queue_labels()) == 1  # the first still waits; the late one never did
    assert h.waited("RejectedCapacity") == (1, 0.0)
    entry = h.decisions.recent()[0]
    assert (entry.key, entry.outcome, entry.response_status) == (late.key, "queue-full", 429)
    assert entry.queue_wait_s is None


REFUSED = "lora_epp_flow_control_refused_total"


def test_flow_control_refusals_are_counted_by_band_and_reason_and_logged() -> None:
    h = FlowHarness(
        FlowControlSettings(
            enabled=True,
            overload=OverloadSettings(wait_target_s=0.5),
            default_band=BandSettings(max_requests=1),
        )
    )
    h.store.replace_objectives(
        [InferenceObjective(name="batch", namespace="default", pool_name="pool", priority=-5)]
    )
    h.scrape(waiting=10)  # saturated: a Sheddable request is refused at once
    for _ in range(2):
        late = h.director.mint()
        headers = {"x-gateway-inference-fairness-id": "tenant-a", "x-gateway-inference-objective": "batch"}
        with pytest.raises(EppError) as caught:
            h.director.arrive(late, headers=headers, body=BODY)
        assert caught.value.reason == "sheddable"
        late.refuse(caught.value)
        late.finish(Ending.REFUSED, h.clock.now())
    h.send()  # a Standard one waits (the EPP has measured no dispatch rate yet)
    with pytest.raises(EppError):
        h.send()  # the band holds one: this one finds it full
    assert h.sample(REFUSED, priority="-5", reason="sheddable") == 2
    assert h.sample(REFUSED, priority="0", reason="queue-full") == 1
    entry = h.decisions.recent()[1]
    assert (entry.outcome, entry.reason, entry.response_status) == ("queue-refused", "sheddable", 429)


def test_fairness_id_label_values_are_capped() -> None:
    h = FlowHarness()
    h.scrape(waiting=10)
    names = [f"tenant-{i:03d}" for i in range(MAX_FAIRNESS_LABELS + 5)]
    for name in names:
        h.send(name)
    seen = names[:MAX_FAIRNESS_LABELS]
    assert all(h.sample(QUEUE_SIZE, **h.queue_labels(name)) == 1 for name in seen)
    assert all(h.sample(QUEUE_SIZE, **h.queue_labels(name)) is None for name in names[MAX_FAIRNESS_LABELS:])
    assert h.sample(QUEUE_SIZE, **h.queue_labels(OTHER_FAIRNESS_LABEL)) == 5
    h.send(names[0])  # a value seen before the cap keeps its own series
    assert h.sample(QUEUE_SIZE, **h.queue_labels(names[0])) == 2
    h.scrape(waiting=0)
    h.director.pump()
    assert h.sample(QUEUE_SIZE, **h.queue_labels(OTHER_FAIRNESS_LABEL)) == 0
    assert h.waited("Dispatched", OTHER_FAIRNESS_LABEL)[0] == 5
    series = {
        sample.labels["fairness_id"]
        for metric in h.registry.collect()
        if metric.name == QUEUE_SIZE
        for sample in metric.samples
    }
    assert len(series) == MAX_FAIRNESS_LABELS + 1
