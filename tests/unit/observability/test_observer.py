"""Metrics, the decision log and trace spans, driven through the real director and stream handler."""

from __future__ import annotations

import json
import random
from collections.abc import Sequence

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client import CollectorRegistry

from epp._proto.envoy.config.core.v3 import base_pb2
from epp._proto.envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from epp.clock import FakeClock
from epp.errors import EppError, ErrorCode
from epp.picker.context import RequestContext
from epp.picker.datastore.types import Criticality, EndpointState, Snapshot
from epp.picker.director import Director
from epp.picker.extproc.stream import StreamHandler, StreamOptions
from epp.picker.observability.decisions import DecisionLog
from epp.picker.observability.metrics import EppMetrics
from epp.picker.observability.observer import Observer
from epp.picker.scheduling.build import build_scheduler_from_config
from epp.picker.scheduling.config import load_config
from epp.picker.scheduling.policies import policy_config_text
from epp.picker.scheduling.types import LLMRequest, Scheduler
from tests.unit.fake_scheduler import FakeScheduler, pool_datastore

PARENT_TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
TRACEPARENT = f"00-{PARENT_TRACE_ID}-00f067aa0ba902b7-01"


def shed_sheddable(
    request: LLMRequest, candidates: Sequence[EndpointState], snapshot: Snapshot, now: float
) -> None:
    if request.sheddable:
        raise EppError(ErrorCode.RESOURCE_EXHAUSTED, "system saturated", reason="saturated")


class Harness:
    def __init__(
        self, *, exhausted: bool = False, shed: bool = False, scheduler: Scheduler | None = None
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
        admit = self.observer.observe_admit(shed_sheddable) if shed else None
        self.director = Director(
            pool_datastore(),
            self.observer.observe_scheduler(scheduler or FakeScheduler(exhausted=exhausted)),
            clock=self.clock,
            rng=random.Random(1),
            **({"admit": admit} if admit is not None else {}),
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
        handler = StreamHandler(
            StreamOptions(self.director, on_finished=self.observer.on_finished, clock=self.clock)
        )
        all_headers = {":method": "POST", "x-request-id": request_id, **(headers or {})}
        handler.handle(
            pb.ProcessingRequest(
                request_headers=pb.HttpHeaders(
                    headers=base_pb2.HeaderMap(
                        headers=[
                            base_pb2.HeaderValue(key=k, raw_value=v.encode()) for k, v in all_headers.items()
                        ]
                    )
                )
            )
        )
        handler.handle(pb.ProcessingRequest(request_body=pb.HttpBody(body=body, end_of_stream=True)))
        if response is not None and not handler.done:
            status = pb.HttpHeaders(
                headers=base_pb2.HeaderMap(
                    headers=[
                        base_pb2.HeaderValue(key=":status", raw_value=b"200"),
                        base_pb2.HeaderValue(key="content-type", raw_value=b"application/json"),
                    ]
                )
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
    h.request(body, request_id="bad")
    labels = {"model_name": "", "target_model_name": ""}
    assert h.sample("inference_objective_request_error_total", **labels, error_code=error_code) == 1
    [entry] = h.decisions.recent()
    assert (entry.request_id, entry.outcome, entry.reason, entry.response_status) == (
        "bad",
        "error",
        reason,
        400,
    )


def test_a_decision_is_logged_with_candidates_choice_and_status() -> None:
    h = Harness()
    h.request(b'{"model":"m","prompt":"x"}', request_id="r7")
    [entry] = h.decisions.recent()
    assert entry.outcome == "routed"
    assert entry.candidates == ("pod-0-rank-0", "pod-1-rank-0")
    assert entry.chosen == ("10.0.0.1:8000",)
    assert entry.reason == "fake"
    assert entry.response_status == 200
    assert h.sample("inference_extension_scheduler_picks_total", profile="default", reason="fake") == 1
    assert h.sample("inference_extension_scheduler_e2e_duration_seconds_count") == 1


def test_an_adapters_decision_names_the_plans_homes_in_the_log_and_the_span() -> None:
    config = load_config(policy_config_text("default"))
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
    h = Harness(shed=True)
    h.request(b'{"model":"m","prompt":"x"}', request_id="s1", headers={"traceparent": TRACEPARENT})
    # FakeScheduler requests are standard; only priority < 0 or sheddable models shed. Make one sheddable.
    assert h.sample("inference_extension_requests_shed_total", criticality="Sheddable") is None
    request = LLMRequest(
        request_id="s2", incoming_model="m", target_model="m", criticality=Criticality.SHEDDABLE
    )
    admit = h.observer.observe_admit(shed_sheddable)
    snapshot = pool_datastore().snapshot()
    with pytest.raises(EppError):
        admit(request, snapshot.endpoints, snapshot, 0.0)
    assert h.sample("inference_extension_requests_shed_total", criticality="Sheddable") == 1
    shed_span = h.exporter.get_finished_spans()[-1]
    assert shed_span.attributes is not None
    assert shed_span.attributes["epp.shed_reason"] == "saturated"
    assert h.decisions.recent()[0].outcome == "shed"


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


def test_trace_headers_name_the_decision_span_on_the_requests_own_context() -> None:
    h = Harness()
    context = RequestContext()
    h.director.route(
        request_id="open", headers={"traceparent": TRACEPARENT}, body=b'{"model":"m"}', context=context
    )
    [(name, value)] = context.upstream_headers
    span = h.exporter.get_finished_spans()[0]
    assert name == "traceparent"
    assert value == f"00-{PARENT_TRACE_ID}-{span.context.span_id:016x}-01"
    assert RequestContext().upstream_headers == []  # another request's context holds none


def test_without_a_tracer_no_trace_headers_are_set() -> None:
    observer = Observer(EppMetrics(CollectorRegistry()), DecisionLog(), FakeClock())
    director = Director(pool_datastore(), observer.observe_scheduler(FakeScheduler()), clock=FakeClock())
    context = RequestContext()
    director.route(
        request_id="q", headers={"traceparent": TRACEPARENT}, body=b'{"model":"m"}', context=context
    )
    assert context.upstream_headers == []


def test_the_decision_log_is_bounded() -> None:
    h = Harness()
    for index in range(10):
        h.request(b'{"model":"m"}', request_id=f"r{index}")
    assert [d.request_id for d in h.decisions.recent()] == ["r9", "r8", "r7", "r6"]


def test_streams_sharing_a_client_request_id_are_each_accounted() -> None:
    h = Harness()
    handlers = []
    for _ in range(2):
        handler = StreamHandler(StreamOptions(h.director, on_finished=h.observer.on_finished))
        handler.handle(
            pb.ProcessingRequest(
                request_headers=pb.HttpHeaders(
                    headers=base_pb2.HeaderMap(
                        headers=[
                            base_pb2.HeaderValue(key="x-request-id", raw_value=b"same"),
                            base_pb2.HeaderValue(key="traceparent", raw_value=TRACEPARENT.encode()),
                        ]
                    )
                )
            )
        )
        handler.handle(
            pb.ProcessingRequest(request_body=pb.HttpBody(body=b'{"model":"m"}', end_of_stream=True))
        )
        handlers.append(handler)
    assert h.sample("inference_objective_running_requests", model_name="m") == 2
    handlers[0].close()
    assert h.sample("inference_objective_running_requests", model_name="m") == 1
    assert handlers[1].context.upstream_headers  # the other stream keeps its own
    assert handlers[0].context.upstream_headers != handlers[1].context.upstream_headers  # one span each
    handlers[1].close()
    assert h.sample("inference_objective_running_requests", model_name="m") == 0
