"""Watches every request the director handles: metrics, the `/debug/decisions` log and one trace span each.

`Observer` is the director's `DecisionObserver`: the director reports each scheduling decision,
refusal, queue entry and exit, and each finished request (its `RequestLife`), so the director
itself stays free of observability code and the scheduler stays pure.
"""

from __future__ import annotations

from collections.abc import Sequence

from opentelemetry.trace import NoOpTracer, Span, Tracer

from epp.clock import Clock
from epp.errors import EppError, ErrorCode
from epp.picker.datastore.types import EndpointState
from epp.picker.lifecycle import RequestLife
from epp.picker.observability import tracing
from epp.picker.observability.decisions import Decision, DecisionLog
from epp.picker.observability.metrics import EppMetrics, RequestOutcome
from epp.picker.scheduling.types import LLMRequest, SchedulingResult


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

    # -- the director's DecisionObserver ----------------------------------------------------

    def scheduled(
        self,
        life: RequestLife,
        candidates: Sequence[EndpointState],
        result: SchedulingResult,
        duration_s: float,
    ) -> None:
        request = life.request
        assert request is not None
        names = tuple(c.name for c in candidates)
        span = self._start_span(life, request, names)
        chosen = tuple(state.address for state in result.endpoints)
        life.decision_logged = True
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
            life.upstream_headers.extend(tracing.traceparent_headers(span))
            span.end()
        self.metrics.record_decision(request, result, duration_s)
        self.metrics.request_started(request.target_model)
        self.decisions.add(
            Decision(
                request_id=life.request_id,
                key=life.key,
                at_s=self._clock.now(),
                model=request.incoming_model,
                target_model=request.target_model,
                criticality=request.criticality.value,
                priority=request.priority,
                outcome="routed",
                candidates=names,
                chosen=chosen,
                profile=result.profile,
                reason=result.reason,
                scores=result.scores,
                total_scores=result.total_scores,
                planned_homes=result.planned_homes,
                duration_s=duration_s,
                queue_wait_s=self._queue_wait(life),
            )
        )

    def refused(
        self,
        life: RequestLife,
        candidates: Sequence[EndpointState],
        error: EppError,
        *,
        outcome: str,
        duration_s: float,
    ) -> None:
        request = life.request
        if outcome == "no-endpoint":
            self.metrics.record_scheduling_failure(duration_s)
        if outcome == "shed" and request is not None and error.code is ErrorCode.RESOURCE_EXHAUSTED:
            self.metrics.record_shed(request.criticality)
        if outcome.startswith("queue-"):
            self.metrics.record_flow_refusal(life.priority, error.reason or "")
        names = tuple(c.name for c in candidates)
        if request is not None:
            span = self._start_span(life, request, names)
            if span is not None:
                if span.is_recording():
                    tracing.set_refusal_attributes(
                        span, error_code=error.code.wire_name, reason=error.reason or ""
                    )
                span.end()
        life.decision_logged = True
        self.decisions.add(
            Decision(
                request_id=life.request_id,
                key=life.key,
                at_s=self._clock.now(),
                model=request.incoming_model if request is not None else "",
                target_model=request.target_model if request is not None else "",
                criticality=request.criticality.value if request is not None else "",
                priority=request.priority if request is not None else 0,
                outcome=outcome,
                candidates=names,
                reason=error.reason or "",
                duration_s=duration_s,
                error_code=error.code.wire_name,
                queue_wait_s=self._queue_wait(life),
            )
        )

    def queued(self, life: RequestLife) -> None:
        self.metrics.queue_entered(life)

    def left_queue(self, life: RequestLife, outcome: str) -> None:
        self.metrics.queue_left(life, outcome, self._clock.now())

    def finished(self, life: RequestLife) -> None:
        """A request ended: request metrics, and the response status on its decision."""
        request = life.request
        outcome = life.outcome
        duration_s = outcome.duration_s
        if duration_s is None and request is not None:
            end = life.finished_at if life.finished_at is not None else self._clock.now()
            duration_s = end - life.arrived_at
        usage = outcome.usage
        model_name, target_model_name = life.models
        self.metrics.record_stream(
            RequestOutcome(
                model_name=model_name,
                target_model_name=target_model_name,
                error=life.error,
                request_body_bytes=outcome.request_body_bytes,
                response_body_bytes=outcome.response_body_bytes,
                prompt_tokens=usage.prompt_tokens if usage is not None else None,
                completion_tokens=usage.completion_tokens if usage is not None else None,
                duration_s=duration_s,
                ttft_s=outcome.ttft_s,
            )
        )
        if life.decision is not None and request is not None:  # counted as running when scheduled
            self.metrics.request_finished(request.target_model)
        if life.decision is not None and life.ending is not None:
            self.metrics.record_finished_by(life.ending.value)
        if life.decision_logged:
            self.decisions.set_status(life.key, outcome.status)
        elif life.error is not None:
            # Refused before admission or scheduling ran (bad body, unknown model, no endpoints).
            self.decisions.add(
                Decision(
                    request_id=life.request_id,
                    key=life.key,
                    at_s=self._clock.now(),
                    model="",
                    target_model="",
                    criticality="",
                    outcome="error",
                    reason=life.error.reason or "",
                    error_code=life.error.code.wire_name,
                    response_status=outcome.status,
                )
            )

    def _queue_wait(self, life: RequestLife) -> float | None:
        """How long `life` waited in flow control, up to now when it is leaving its queue right now
        (refused there: neither dispatched nor finished yet); None when it never queued."""
        if life.queued_at is None:
            return None
        waited = life.queue_wait_s
        return waited if waited is not None else self._clock.now() - life.queued_at

    # -- spans ------------------------------------------------------------------------------

    def _start_span(
        self, life: RequestLife, request: LLMRequest, candidate_names: Sequence[str]
    ) -> Span | None:
        """The decision span, or None when tracing is off."""
        if not self._tracing:
            return None
        span = self._tracer.start_span(tracing.DECISION_SPAN, context=tracing.parent_context(request.headers))
        if span.is_recording():
            tracing.set_decision_attributes(
                span,
                request_id=life.request_id,
                model=request.incoming_model,
                target_model=request.target_model,
                criticality=request.criticality.value,
                candidates=candidate_names,
            )
        return span


__all__ = ["Observer"]
