"""Tracing switches and W3C context handling."""

from __future__ import annotations

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import NoOpTracer

from epp.picker.observability import tracing


@pytest.mark.parametrize(
    ("flag", "environ", "expected"),
    [
        (False, {}, False),
        (True, {}, True),
        (False, {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4317"}, True),
        (False, {"OTEL_EXPORTER_OTLP_ENDPOINT": "  "}, False),
    ],
    ids=["off-by-default", "flag", "otlp-endpoint", "blank-endpoint"],
)
def test_tracing_enabled(flag: bool, environ: dict[str, str], expected: bool) -> None:
    assert tracing.tracing_enabled(flag, environ) is expected


@pytest.mark.parametrize(
    "headers",
    [{}, {"traceparent": "garbage"}, {"traceparent": "00-" + "0" * 32 + "-" + "0" * 16 + "-01"}],
    ids=["absent", "malformed", "all-zero"],
)
def test_a_bad_or_missing_traceparent_starts_a_new_trace(headers: dict[str, str]) -> None:
    exporter = InMemorySpanExporter()
    provider = tracing.build_tracer_provider(exporter=exporter)
    tracer = tracing.decision_tracer(provider)
    span = tracer.start_span(tracing.DECISION_SPAN, context=tracing.parent_context(headers))
    [(name, value)] = tracing.traceparent_headers(span)
    span.end()
    provider.force_flush()
    assert name == "traceparent"
    assert value.split("-")[1] == f"{span.get_span_context().trace_id:032x}" != "0" * 32
    assert exporter.get_finished_spans()[0].parent is None
    provider.shutdown()


def test_tracing_off_uses_a_no_op_tracer() -> None:
    assert isinstance(tracing.decision_tracer(None), NoOpTracer)


def test_the_otlp_exporter_loads() -> None:
    """Catches an install where another package's older `opentelemetry/proto` files won."""
    provider = tracing.build_tracer_provider()
    provider.shutdown()
