"""Watches every routing decision: metrics, the `/debug/decisions` log and one trace span each.

`Observer` wraps the scheduler (`observe_scheduler`) and the admission function (`observe_admit`)
the director calls, so the director itself stays free of observability code, and takes each
finished stream (`on_finished`) for the request metrics. The scheduler stays pure: the wrapper
only reads its inputs and result, times the call and writes them down.
"""

from __future__ import annotations

from collections.abc import Sequence

from opentelemetry.trace import NoOpTracer, Span, Tracer

from epp.clock import Clock
from epp.errors import EppError, ErrorCode
from epp.picker.datastore.types import EndpointState, Snapshot
from epp.picker.director import AdmitFn
from epp.picker.observability import tracing
from epp.picker.observability.decisions import Decision, DecisionLog
from epp.picker.observability.metrics import EppMetrics, RequestOutcome
from epp.picker.outcome import StreamRecord
from epp.picker.scheduling.types import LLMRequest, Scheduler, SchedulingResult


class Observer:
    """One per EPP process; all methods run on the event loop."""

    def __init__(
        self,
        metrics: EppMetrics,
        decisions: DecisionLog,
        clock: Clock,
        *,
        tracer: Tracer | None = None,
    ) -> None:
        self.metrics = metrics
        self.decisions = decisions
        self._clock = clock
        self._tracer = tracer if tracer is not None else NoOpTracer()
        # Tracing off: no span, no trace-context parsing, no attributes (they would be dropped).
        self._tracing = not isinstance(self._tracer, NoOpTracer)

    def observe_scheduler(self, scheduler: Scheduler) -> Scheduler:
        return _ObservedScheduler(scheduler, self)

    def observe_admit(self, admit: AdmitFn) -> AdmitFn:
        def observed(
            request: LLMRequest, candidates: Sequence[EndpointState], snapshot: Snapshot, now: float
        ) -> None:
            try:
                admit(request, candidates, snapshot, now)
            except EppError as err:
                self._refused(request, candidates, err, outcome="shed", duration_s=0.0)
                if err.code is ErrorCode.RESOURCE_EXHAUSTED:
                    self.metrics.record_shed(request.criticality)
                raise

        return observed

    def on_finished(self, record: StreamRecord) -> None:
        """A stream ended: request metrics, and the response status on its decision."""
        context = record.context
        decision = record.decision
        request = decision.request if decision is not None else None
        duration_s = record.duration_s
        if duration_s is None and request is not None:
            duration_s = self._clock.now() - request.arrival_s
        usage = record.usage
        if request is not None:
            model_name, target_model_name = request.incoming_model, request.target_model
        else:
            model_name, target_model_name = context.models
        self.metrics.record_stream(
            RequestOutcome(
                model_name=model_name,
                target_model_name=target_model_name,
                error=record.error,
                request_body_bytes=record.request_body_bytes,
                response_body_bytes=record.response_body_bytes,
                prompt_tokens=usage.prompt_tokens if usage is not None else None,
                completion_tokens=usage.completion_tokens if usage is not None else None,
                duration_s=duration_s,
                ttft_s=record.ttft_s,
            )
        )
        if request is not None:  # a decision means the scheduler's on_routed ran
            self.metrics.request_finished(request.target_model)
        if record.finished_by is not None:
            self.metrics.record_finished_by(record.finished_by.value)
        if context.decision_logged:
            self.decisions.set_status(record.request_id, record.response_status)
        elif record.error is not None and record.request_id:
            # Refused before admission or scheduling ran (bad body, unknown model, no endpoints).
            self.decisions.add(
                Decision(
                    request_id=record.request_id,
                    at_s=self._clock.now(),
                    model="",
                    target_model="",
                    criticality="",
                    outcome="error",
                    reason=record.error.reason or "",
                    error_code=record.error.code.wire_name,
                    response_status=record.response_status,
                )
            )

    # -- called by the wrappers ------------------------------------------------------------

    def _start_span(self, request: LLMRequest, candidate_names: Sequence[str]) -> Span | None:
        """The decision span, or None when tracing is off."""
        if not self._tracing:
            return None
        span = self._tracer.start_span(tracing.DECISION_SPAN, context=tracing.parent_context(request.headers))
        if span.is_recording():
            tracing.set_decision_attributes(
                span,
                request_id=request.request_id,
                model=request.incoming_model,
                target_model=request.target_model,
                criticality=request.criticality.value,
                candidates=candidate_names,
            )
        return span

    def _refused(
        self,
        request: LLMRequest,
        candidates: Sequence[EndpointState],
        err: EppError,
        *,
        outcome: str,
        duration_s: float,
    ) -> None:
        names = tuple(c.name for c in candidates)
        span = self._start_span(request, names)
        if span is not None:
            if span.is_recording():
                tracing.set_refusal_attributes(span, error_code=err.code.wire_name, reason=err.reason or "")
            span.end()
        context = request.context
        context.decision_logged = True
        context.models = (request.incoming_model, request.target_model)
        self.decisions.add(
            Decision(
                request_id=request.request_id,
                at_s=self._clock.now(),
                model=request.incoming_model,
                target_model=request.target_model,
                criticality=request.criticality.value,
                outcome=outcome,
                candidates=names,
                reason=err.reason or "",
                duration_s=duration_s,
                error_code=err.code.wire_name,
            )
        )

    def _scheduled(
        self,
        request: LLMRequest,
        candidates: Sequence[EndpointState],
        result: SchedulingResult,
        duration_s: float,
    ) -> None:
        names = tuple(c.name for c in candidates)
        span = self._start_span(request, names)
        chosen = tuple(state.address for state in result.endpoints)
        request.context.decision_logged = True
        if span is not None:
            if span.is_recording():
                tracing.set_result_attributes(
                    span,
                    chosen=chosen,
                    profile=result.profile,
                    reason=result.reason,
                    scores=result.scores,
                    total_scores=result.total_scores,
                    planned_homes=result.planned_homes,
                )
            request.context.upstream_headers.extend(tracing.traceparent_headers(span))
            span.end()
        self.metrics.record_decision(request, result, duration_s)
        self.decisions.add(
            Decision(
                request_id=request.request_id,
                at_s=self._clock.now(),
                model=request.incoming_model,
                target_model=request.target_model,
                criticality=request.criticality.value,
                outcome="routed",
                candidates=names,
                chosen=chosen,
                profile=result.profile,
                reason=result.reason,
                scores=result.scores,
                total_scores=result.total_scores,
                planned_homes=result.planned_homes,
                duration_s=duration_s,
            )
        )

    def _routed(self, request: LLMRequest) -> None:
        self.metrics.request_started(request.target_model)


class _ObservedScheduler:
    """A `Scheduler` that times and records each call to the one it wraps."""

    def __init__(self, inner: Scheduler, observer: Observer) -> None:
        self._inner = inner
        self._observer = observer
        self.name = inner.name

    def schedule(
        self, request: LLMRequest, candidates: Sequence[EndpointState], snapshot: Snapshot, now: float
    ) -> SchedulingResult:
        clock = self._observer._clock
        started = clock.now()
        try:
            result = self._inner.schedule(request, candidates, snapshot, now)
        except EppError as err:
            duration_s = clock.now() - started
            self._observer.metrics.record_scheduling_failure(duration_s)
            self._observer._refused(request, candidates, err, outcome="no-endpoint", duration_s=duration_s)
            raise
        self._observer._scheduled(request, candidates, result, clock.now() - started)
        return result

    def on_routed(self, request: LLMRequest, result: SchedulingResult, now: float) -> None:
        self._inner.on_routed(request, result, now)
        self._observer._routed(request)

    def on_completed(self, request: LLMRequest, endpoint_name: str, now: float) -> None:
        self._inner.on_completed(request, endpoint_name, now)
