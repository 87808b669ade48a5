"""OpenTelemetry tracing: one span per routing decision, W3C trace context in and out.

Off by default. On with `--tracing` or when the standard `OTEL_EXPORTER_OTLP_ENDPOINT` is set;
spans go to an OTLP/gRPC exporter (its endpoint, headers and TLS come from the standard
`OTEL_EXPORTER_OTLP_*` variables). The incoming `traceparent`/`tracestate` headers make the
decision span a child of the caller's trace, and `traceparent_headers` gives the headers to set
on the upstream request so the model server's spans join the same trace.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
from opentelemetry.trace import Span, Tracer
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from epp.errors import ConfigError

SERVICE_NAME = "lora-epp"
TRACER_NAME = "epp"
DECISION_SPAN = "epp.decision"
OTLP_ENDPOINT_ENV = "OTEL_EXPORTER_OTLP_ENDPOINT"

_PROPAGATOR = TraceContextTextMapPropagator()


def tracing_enabled(flag: bool, environ: Mapping[str, str]) -> bool:
    """`--tracing`, or an OTLP endpoint configured the standard way."""
    return flag or bool(environ.get(OTLP_ENDPOINT_ENV, "").strip())


def build_tracer_provider(
    *, exporter: SpanExporter | None = None, service_name: str = SERVICE_NAME
) -> TracerProvider:
    """A provider exporting in batches to `exporter` (default: OTLP/gRPC from the environment)."""
    provider = TracerProvider(resource=Resource.create({"service.name": service_name}))
    if exporter is None:
        exporter = _otlp_exporter()
    provider.add_span_processor(BatchSpanProcessor(exporter))
    return provider


def _otlp_exporter() -> SpanExporter:
    """The OTLP/gRPC exporter; a broken install (e.g. `opentelemetry-proto` files overwritten by an
    older copy another package ships) is a ConfigError at start-up, not a crash mid-request."""
    try:
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
    except ImportError as err:
        raise ConfigError(
            f"--tracing: the OTLP exporter cannot be loaded ({err}); "
            "another package overwrote its modules: "
            "reinstall opentelemetry-proto and googleapis-common-protos"
        ) from err
    return OTLPSpanExporter()


def decision_tracer(provider: TracerProvider | None) -> Tracer:
    """The tracer for decision spans; a no-op tracer when tracing is off."""
    if provider is None:
        return trace.NoOpTracer()
    return provider.get_tracer(TRACER_NAME)


def parent_context(headers: Mapping[str, str]) -> Context:
    """The caller's trace context from lower-cased request headers (empty when absent or malformed)."""
    return _PROPAGATOR.extract(carrier=dict(headers))


def traceparent_headers(span: Span) -> list[tuple[str, str]]:
    """`traceparent` (and `tracestate`) for the upstream request, naming `span` as the parent.

    Call it before `span.end()`. Empty for a span that is not recorded (tracing off): the
    client's own header then reaches the model server unchanged.
    """
    if not span.is_recording():
        return []
    carrier: dict[str, str] = {}
    _PROPAGATOR.inject(carrier, context=trace.set_span_in_context(span))
    return sorted(carrier.items())


def set_decision_attributes(
    span: Span,
    *,
    request_id: str,
    model: str,
    target_model: str,
    criticality: str,
    candidates: Sequence[str],
) -> None:
    span.set_attribute("epp.request_id", request_id)
    span.set_attribute("epp.model", model)
    span.set_attribute("epp.target_model", target_model)
    span.set_attribute("epp.criticality", criticality)
    span.set_attribute("epp.candidates", list(candidates))


def set_result_attributes(
    span: Span,
    *,
    chosen: Sequence[str],
    profile: str,
    reason: str,
    scores: Mapping[str, Mapping[str, float]],
    total_scores: Mapping[str, float],
    planned_homes: Sequence[str] = (),
) -> None:
    span.set_attribute("epp.chosen", list(chosen))
    if chosen:
        span.set_attribute("epp.destination", chosen[0])
    span.set_attribute("epp.profile", profile)
    span.set_attribute("epp.reason", reason)
    span.set_attribute("epp.scores", json.dumps({k: dict(v) for k, v in scores.items()}, sort_keys=True))
    span.set_attribute("epp.total_scores", json.dumps(dict(total_scores), sort_keys=True))
    if planned_homes:
        span.set_attribute("epp.planned_homes", list(planned_homes))


def set_refusal_attributes(span: Span, *, error_code: str, reason: str) -> None:
    span.set_attribute("epp.error_code", error_code)
    span.set_attribute("epp.shed_reason", reason)
    span.set_status(trace.Status(trace.StatusCode.ERROR, reason or error_code))
