"""One request's way from arrival to an endpoint, and its finish.

The director is synchronous and does no I/O. `mint` gives a new request its life (its key);
`arrive` reads its body, resolves the model, builds the `LLMRequest`, narrows the candidates by
the subset hint and then either dispatches it at once (admission, then the scheduler) or, with
flow control, files it in a queue that `pump` dispatches from as capacity frees. Every failure
is an `EppError` for the caller to answer. Every ending goes through the life's one `finish`,
which the director receives here: it releases the request's queue place or in-flight entry
(through the routing ledger) and tells the observer.

`epp serve` and `epp bench` drive the same director: a benchmark figure speaks for the code that
routes traffic, queueing included.
"""

from __future__ import annotations

import json
import logging
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from epp.clock import Clock
from epp.errors import EppError, ErrorCode
from epp.picker import wire
from epp.picker.datastore.store import Datastore
from epp.picker.datastore.types import Criticality, EndpointState, InferenceModel, Snapshot
from epp.picker.flowcontrol import FlowControl
from epp.picker.flowcontrol.controller import Placement, Rejection
from epp.picker.flowcontrol.overload import RefusalReason, Verdict
from epp.picker.flowcontrol.queues import QueueItem
from epp.picker.lifecycle import KeyMint, RequestLife, RoutingDecision, Stage
from epp.picker.scheduling.framework import record_routed
from epp.picker.scheduling.types import LLMRequest, Scheduler, SchedulingResult

log = logging.getLogger(__name__)

# admit(request, candidates, snapshot, now) raises EppError(RESOURCE_EXHAUSTED) to shed.
AdmitFn = Callable[[LLMRequest, Sequence[EndpointState], Snapshot, float], None]

DEFAULT_FAIRNESS_ID = "default-flow"  # a request that names no fairness ID, as upstream


def admit_all(
    request: LLMRequest, candidates: Sequence[EndpointState], snapshot: Snapshot, now: float
) -> None:
    """Admission that never sheds (used when no admission policy is configured)."""


class QueueOutcome:
    """Why a request left a flow-control queue: upstream's outcome names, as the metrics label them."""

    DISPATCHED = "Dispatched"
    REJECTED_CAPACITY = "RejectedCapacity"
    EVICTED_TTL = "EvictedTTL"
    EVICTED_CANCELLED = "EvictedContextCancelled"
    EVICTED_NO_ENDPOINTS = "EvictedNoEndpoints"
    EVICTED_OTHER = "EvictedOther"


class DecisionObserver(Protocol):
    """What the director reports as it works (metrics, the decision log, traces): `epp serve`'s
    `observability.Observer`; `NO_OBSERVER` for callers that watch nothing."""

    def scheduled(
        self,
        life: RequestLife,
        candidates: Sequence[EndpointState],
        result: SchedulingResult,
        duration_s: float,
    ) -> None: ...

    def refused(
        self,
        life: RequestLife,
        candidates: Sequence[EndpointState],
        error: EppError,
        *,
        outcome: str,
        duration_s: float,
    ) -> None: ...

    def queued(self, life: RequestLife) -> None: ...

    def left_queue(self, life: RequestLife, outcome: str) -> None: ...

    def finished(self, life: RequestLife) -> None: ...


class _NoObserver:
    def scheduled(
        self,
        life: RequestLife,
        candidates: Sequence[EndpointState],
        result: SchedulingResult,
        duration_s: float,
    ) -> None:
        pass

    def refused(
        self,
        life: RequestLife,
        candidates: Sequence[EndpointState],
        error: EppError,
        *,
        outcome: str,
        duration_s: float,
    ) -> None:
        pass

    def queued(self, life: RequestLife) -> None:
        pass

    def left_queue(self, life: RequestLife, outcome: str) -> None:
        pass

    def finished(self, life: RequestLife) -> None:
        pass


NO_OBSERVER: DecisionObserver = _NoObserver()


@dataclass(frozen=True, slots=True)
class SubsetHint:
    """The data plane's `envoy.lb.subset_hint` list: `ip:port` entries match exactly, bare IPs by IP."""

    addresses: frozenset[str]
    ips: frozenset[str]

    @classmethod
    def parse(cls, entries: Sequence[str]) -> SubsetHint:
        addresses: set[str] = set()
        ips: set[str] = set()
        for entry in entries:
            for item in entry.split(","):
                item = item.strip()
                if not item:
                    continue
                if _has_port(item):
                    addresses.add(item)
                else:
                    ips.add(item.strip("[]"))
        return cls(frozenset(addresses), frozenset(ips))

    def allows(self, state: EndpointState) -> bool:
        return state.address in self.addresses or state.endpoint.ip in self.ips


def _has_port(item: str) -> bool:
    if item.startswith("["):
        return "]:" in item
    return item.count(":") == 1


class Director:
    """Admits, queues, dispatches and finishes requests against one datastore. Not thread-safe."""

    def __init__(
        self,
        datastore: Datastore,
        scheduler: Scheduler,
        *,
        admit: AdmitFn = admit_all,
        flow: FlowControl | None = None,
        clock: Clock,
        rng: random.Random | None = None,
        observer: DecisionObserver = NO_OBSERVER,
        keys: KeyMint | None = None,
    ) -> None:
        self._datastore = datastore
        self._scheduler = scheduler
        self._ledger = scheduler.state.ledger
        self._admit = admit
        self._flow = flow
        self._clock = clock
        self._rng = rng if rng is not None else random.Random()
        self._observer = observer
        self._keys = keys if keys is not None else KeyMint()
        self._pumping = False
        self._pump_again = False
        if flow is not None:
            datastore.on_endpoints_changed(self._endpoints_changed)

    @property
    def scheduler(self) -> Scheduler:
        return self._scheduler

    @property
    def flow(self) -> FlowControl | None:
        return self._flow

    @property
    def key_prefix(self) -> str:
        """What every key this director mints starts with (unique to this process)."""
        return self._keys.prefix

    # -- a request's life -------------------------------------------------------------------

    def mint(self, request_id: str = "") -> RequestLife:
        """A new request's life, arrived now."""
        key = self._keys()
        return RequestLife(key, request_id or key, self._clock.now(), self._finished)

    def arrive(
        self,
        life: RequestLife,
        *,
        headers: Mapping[str, str],
        body: bytes | None,
        subset: Sequence[str] | None = None,
    ) -> bytes:
        """Take the request in; returns the body to send on (rewritten when its model was).

        Afterwards the life is DISPATCHED (its decision set) or QUEUED (its waiter is called when
        it leaves the queue). `body=None` is a request without a body (e.g. GET); `headers` are
        lower-cased; `subset` is the data plane's subset hint, None when it sent none. Raises
        `EppError` for a request refused now; the caller answers it and finishes the life.
        """
        now = self._clock.now()
        snapshot = self._datastore.snapshot()
        payload = parse_body(body) if body is not None else None
        request, new_body = self._build_request(
            key=life.key,
            headers=headers,
            body=body,
            payload=payload,
            snapshot=snapshot,
            arrival_s=life.arrived_at,
        )
        life.request = request
        life.models = (request.incoming_model, request.target_model)
        life.outcome.request_body_bytes = len(body) if body is not None else 0
        life.subset = tuple(subset) if subset is not None else None
        candidates = select_candidates(snapshot, subset)
        self._admit_or_refuse(life, candidates, snapshot, now)
        flow = self._flow
        if flow is None:
            self._dispatch(life, candidates, snapshot, now)
            return new_body
        self._enqueue_or_dispatch(flow, life, headers, candidates, snapshot, now)
        return new_body

    def pump(self) -> None:
        """Answer queued requests whose TTL ran out and dispatch what capacity allows now.

        Called whenever capacity may have freed: a request finished (the director does it), a
        scrape or a peer's batch arrived, or a timer. Waiters are told after the pass.
        """
        flow = self._flow
        if flow is None or not flow.queues:
            return
        if self._pumping:  # a waiter finished a request during the pass: run once more after it
            self._pump_again = True
            return
        self._pumping = True
        # A completion that never came must not hold a slot the queue waits for.
        self._ledger.inflight.expire(self._clock.now())
        try:
            while True:
                self._pump_again = False
                self._pump_once(flow)
                if not self._pump_again or not flow.queues:
                    break
        finally:
            self._pumping = False

    def release_queues(self) -> None:
        """Dispatch every queued request now, highest band first, each to the endpoint the
        scheduler likes best whatever the pool's load (shutting down).

        An EPP that is leaving can no longer dispatch from its queues; the pods' own queues can
        still hold the requests. Refusing them instead would fail requests a rolling restart
        could have served. Only a request with no endpoint at all is refused.
        """
        flow = self._flow
        if flow is None:
            return
        snapshot = self._datastore.snapshot()
        now = self._clock.now()
        for item in flow.queues.drain():
            self._place_anywhere(item.payload, snapshot, now)
            _tell(item.payload)

    def _endpoints_changed(self) -> None:
        flow = self._flow
        if flow is not None:
            flow.gate.forget({endpoint.name for endpoint in self._datastore.endpoints()})

    def _finished(self, life: RequestLife) -> None:
        """The finisher every life calls once: release what it holds, report it, let the queue move."""
        now = life.finished_at if life.finished_at is not None else self._clock.now()
        flow = self._flow
        if life.stage is Stage.QUEUED and flow is not None and flow.queues.remove(life) is not None:
            self._observer.left_queue(life, QueueOutcome.EVICTED_CANCELLED)
        usage = life.outcome.usage
        if flow is not None and life.stage is Stage.DISPATCHED and usage is not None:
            # Fairness by tokens served: output tokens count (twice, as VTC weighs them) as they end.
            flow.queues.charge(life.priority, life.fairness_id, OUTPUT_TOKEN_WEIGHT * usage.completion_tokens)
        released = (
            life.stage is Stage.DISPATCHED
            and self._ledger.finished(life.key, now, ttft_s=life.upstream_ttft_s) is not None
        )
        if life.decision is not None and log.isEnabledFor(logging.DEBUG):
            log.debug(
                "request finished",
                extra={
                    "request_id": life.request_id,
                    "status": life.outcome.status,
                    "served": life.outcome.served_address,
                    "finished_by": life.ending.value if life.ending is not None else "",
                },
            )
        self._observer.finished(life)
        if released and flow is not None:
            self.pump()

    # -- dispatch ---------------------------------------------------------------------------

    def _admit_or_refuse(
        self, life: RequestLife, candidates: Sequence[EndpointState], snapshot: Snapshot, now: float
    ) -> None:
        request = life.request
        assert request is not None
        try:
            self._admit(request, candidates, snapshot, now)
        except EppError as err:
            self._observer.refused(life, candidates, err, outcome="shed", duration_s=0.0)
            raise

    def _dispatch(
        self, life: RequestLife, candidates: Sequence[EndpointState], snapshot: Snapshot, now: float
    ) -> None:
        """Schedule over `candidates` and count the request in flight on its primary endpoint."""
        request = life.request
        assert request is not None
        clock = self._clock
        started = clock.now()
        try:
            result = self._scheduler.schedule(request, candidates, snapshot, now)
            if not result.endpoints:
                raise EppError(
                    ErrorCode.RESOURCE_EXHAUSTED, "failed to find a target endpoint", reason="no-pick"
                )
        except EppError as err:
            self._observer.refused(
                life, candidates, err, outcome="no-endpoint", duration_s=clock.now() - started
            )
            raise
        record_routed(self._scheduler, request, result, now)
        life.decision = RoutingDecision(endpoints=result.endpoints, request=request, result=result)
        life.stage = Stage.DISPATCHED
        life.dispatched_at = now
        flow = self._flow
        if flow is not None and flow.judge is not None:
            flow.judge.dispatched(now)
        if flow is not None and flow.shares is not None:
            flow.shares.dispatched(now)
        self._observer.scheduled(life, candidates, result, clock.now() - started)

    def _enqueue_or_dispatch(
        self,
        flow: FlowControl,
        life: RequestLife,
        headers: Mapping[str, str],
        candidates: Sequence[EndpointState],
        snapshot: Snapshot,
        now: float,
    ) -> None:
        """Dispatch now when nothing waits that this request may not pass and some candidate can
        start it; refuse it now when the pool is saturated and it cannot be served in time (the
        judge); else queue it (and, when a candidate could start it but others wait first, run a
        pass at once, so it goes in its turn)."""
        request = life.request
        assert request is not None
        queues = flow.queues
        lane = _lane(request, life.subset)
        fairness_id = life.fairness_id = fairness_id_of(headers)
        priority = life.priority = band_priority(request)
        cost = prompt_token_estimate(request)
        if flow.shares is not None:
            flow.shares.arrived(priority, fairness_id, now)
        placeable = _placeable(flow, life, candidates, now)
        waiting = queues.waiting_from(priority) > 0
        if placeable and not waiting:
            self._dispatch(life, placeable, snapshot, now)
            queues.charge(priority, fairness_id, cost)
            return
        judge = flow.judge
        saturated = judge is not None and not placeable and _full_for(flow, life, candidates, now)
        if judge is not None and not placeable:
            judge.observe(saturated, queues.oldest_from(0, now), now)
        if judge is not None and saturated:
            verdict = judge.on_arrival(priority, queues.position(priority, fairness_id), now)
            if verdict is not None:
                flow.gate.overloaded(now)
                error = _refusal(verdict)
                self._observer.refused(life, candidates, error, outcome="queue-refused", duration_s=0.0)
                self._observer.left_queue(life, QueueOutcome.REJECTED_CAPACITY)
                raise error
        filed = queues.enqueue(
            life,
            fairness_id=fairness_id,
            priority=priority,
            lane=lane,
            size=life.outcome.request_body_bytes,
            now=now,
            ttl_s=queues.settings.request_ttl_s,
            cost=cost,
        )
        if isinstance(filed, Rejection):
            error = EppError(
                ErrorCode.RESOURCE_EXHAUSTED,
                "request rejected pre-queue: queue at capacity",
                reason="queue-full" if filed is Rejection.BAND_FULL else "pool-queue-full",
            )
            self._observer.refused(life, candidates, error, outcome="queue-full", duration_s=0.0)
            self._observer.left_queue(life, QueueOutcome.REJECTED_CAPACITY)
            raise error
        life.stage = Stage.QUEUED
        life.queued_at = now
        self._observer.queued(life)
        if placeable:
            self._pass_for_newcomer(life)
        elif not _held_for_reserve(flow, life, candidates, now):
            flow.gate.blocked(request, candidates, since=now, now=now)

    def _pass_for_newcomer(self, life: RequestLife) -> None:
        """A pass while `life` is being filed: it leaves as DISPATCHED (the caller's answer) or stays
        QUEUED; its waiter is for a later departure, so it is not called for one in this pass."""
        waiter, life.waiter = life.waiter, None
        self.pump()
        if life.stage is Stage.QUEUED and life.error is None:
            life.waiter = waiter
        elif life.error is not None:
            raise life.error

    def _pump_once(self, flow: FlowControl) -> None:
        now = self._clock.now()
        queues = flow.queues
        for item in queues.expire(now):
            error = EppError(
                ErrorCode.SERVICE_UNAVAILABLE,
                "request timed out in queue: request TTL expired",
                reason="queue-ttl",
            )
            self._leave_queue(item.payload, error, QueueOutcome.EVICTED_TTL)
        if not queues:
            return
        snapshot = self._datastore.snapshot()
        judge = flow.judge
        saturated = (
            judge is not None
            and bool(snapshot.endpoints)
            and (flow.gate.saturated(snapshot.endpoints, now) or _reserve_held(flow, snapshot.endpoints, now))
        )
        if judge is not None:
            judge.observe(saturated, queues.oldest_from(0, now), now)
        if judge is not None and saturated:
            shed = queues.take_below(0)
            late = queues.overdue(now, judge.settings.wait_target_s) if judge.standing(now) else []
            if shed or late:
                flow.gate.overloaded(now)
            for item in shed:
                verdict = judge.shed(item.priority, now)
                self._leave_queue(item.payload, _refusal(verdict), QueueOutcome.REJECTED_CAPACITY)
            for item in late:
                verdict = judge.waited_too_long(item.priority, now - item.enqueued_at)
                self._leave_queue(item.payload, _refusal(verdict), QueueOutcome.REJECTED_CAPACITY)
            if not queues:
                return

        def place(item: QueueItem[RequestLife]) -> Placement:
            return self._place(flow, item.payload, snapshot, now)

        result = queues.dispatch(now, place)
        for item in result.placed:
            _tell(item.payload)
        for item in result.refused:
            _tell(item.payload)
        for head in result.blocked:
            life = head.payload
            request = life.request
            assert request is not None
            try:
                candidates = select_candidates(snapshot, life.subset)
            except EppError:
                continue
            if not _held_for_reserve(flow, life, candidates, now):
                flow.gate.blocked(request, candidates, since=head.enqueued_at, now=now)

    def _place(self, flow: FlowControl, life: RequestLife, snapshot: Snapshot, now: float) -> Placement:
        request = life.request
        assert request is not None
        candidates = self._candidates_or_refuse(life, snapshot)
        if candidates is None:
            return Placement.REFUSED
        placeable = _placeable(flow, life, candidates, now)
        if not placeable:
            return Placement.BLOCKED
        return self._dispatch_from_queue(life, placeable, snapshot, now)

    def _place_anywhere(self, life: RequestLife, snapshot: Snapshot, now: float) -> Placement:
        """Dispatch a queued request over every candidate, whatever their load (shutting down)."""
        candidates = self._candidates_or_refuse(life, snapshot)
        if candidates is None:
            return Placement.REFUSED
        return self._dispatch_from_queue(life, candidates, snapshot, now)

    def _candidates_or_refuse(
        self, life: RequestLife, snapshot: Snapshot
    ) -> tuple[EndpointState, ...] | None:
        try:
            return select_candidates(snapshot, life.subset)
        except EppError as err:
            life.refuse(err)
            outcome = QueueOutcome.EVICTED_NO_ENDPOINTS
            self._observer.refused(life, (), err, outcome="queue-" + outcome, duration_s=0.0)
            self._observer.left_queue(life, outcome)
            return None

    def _dispatch_from_queue(
        self, life: RequestLife, candidates: Sequence[EndpointState], snapshot: Snapshot, now: float
    ) -> Placement:
        try:
            self._dispatch(life, candidates, snapshot, now)
        except EppError as err:
            life.refuse(err)
            self._observer.left_queue(life, QueueOutcome.EVICTED_OTHER)
            return Placement.REFUSED
        self._observer.left_queue(life, QueueOutcome.DISPATCHED)
        return Placement.PLACED

    def _leave_queue(self, life: RequestLife, error: EppError, outcome: str) -> None:
        life.refuse(error)
        self._observer.refused(life, (), error, outcome="queue-" + outcome, duration_s=0.0)
        self._observer.left_queue(life, outcome)
        _tell(life)

    # -- the request ------------------------------------------------------------------------

    def _build_request(
        self,
        *,
        key: str,
        headers: Mapping[str, str],
        body: bytes | None,
        payload: dict[str, Any] | None,
        snapshot: Snapshot,
        arrival_s: float,
    ) -> tuple[LLMRequest, bytes]:
        objective = headers.get(wire.OBJECTIVE_HEADER) or None
        priority = 0
        if objective is not None and objective in snapshot.objectives:
            priority = snapshot.objectives[objective].priority
        if payload is None:
            request = LLMRequest(
                request_id=key,
                incoming_model="",
                target_model="",
                priority=priority,
                objective=objective,
                headers=headers,
                arrival_s=arrival_s,
            )
            return request, b""
        assert body is not None
        incoming = payload.get("model")
        if not isinstance(incoming, str):
            raise EppError(ErrorCode.BAD_REQUEST, "model not found in request body", reason="no-model")
        criticality = Criticality.STANDARD
        rewrite = headers.get(wire.MODEL_NAME_REWRITE_HEADER)
        if rewrite:
            target = rewrite
            model = snapshot.models.get(incoming)
            if model is not None and model.criticality is not None:
                criticality = model.criticality
        elif snapshot.has_model_registry:
            model = snapshot.models.get(incoming)
            if model is None:
                raise EppError(
                    ErrorCode.NOT_FOUND,
                    f"error finding a model object in InferenceModel for input model {incoming}",
                    reason="unknown-model",
                )
            target = self._draw_target(model)
            criticality = model.criticality or Criticality.STANDARD
        else:
            target = incoming
        new_body = body
        if target != incoming:
            payload["model"] = target
            new_body = replace_top_level_string(body, "model", target)
        request = LLMRequest(
            request_id=key,
            incoming_model=incoming,
            target_model=target,
            criticality=criticality,
            priority=priority,
            objective=objective,
            prompt=prompt_text(payload),
            headers=headers,
            body_size=len(new_body),
            arrival_s=arrival_s,
        )
        return request, new_body

    def _draw_target(self, model: InferenceModel) -> str:
        """Weighted draw over the InferenceModel's targets; no weights → uniform; no targets → modelName."""
        targets = model.target_models
        if not targets:
            return model.model_name
        weights = [t.weight for t in targets]
        if all(w is None for w in weights):
            return self._rng.choice(targets).name
        numeric = [w or 0 for w in weights]
        if sum(numeric) <= 0:
            return self._rng.choice(targets).name
        return self._rng.choices(targets, weights=numeric, k=1)[0].name


# VTC (Sheng et al., OSDI '24) weighs an output token as two prompt tokens: it costs a decode step.
OUTPUT_TOKEN_WEIGHT = 2
CHARS_PER_TOKEN = 4  # for a prompt's token count where nothing tokenizes it


def prompt_token_estimate(request: LLMRequest) -> int:
    """The request's prompt tokens, estimated from its text (0: no text, count its bytes instead)."""
    return len(request.prompt) // CHARS_PER_TOKEN


def _refusal(verdict: Verdict) -> EppError:
    """The 429 the judge's verdict answers with, `Retry-After` its estimated wait."""
    messages = {
        RefusalReason.SHEDDABLE: "the pool is saturated and the request is sheddable",
        RefusalReason.PREDICTED_WAIT: "the pool is saturated and the request cannot be dispatched in time",
        RefusalReason.WAITED_TOO_LONG: "the pool is saturated and the request waited too long",
    }
    message = messages.get(verdict.reason, "the pool is saturated")
    return EppError(
        ErrorCode.RESOURCE_EXHAUSTED,
        f"request rejected by flow control: {message} (estimated wait {verdict.estimated_wait_s:.1f}s)",
        reason=verdict.reason.value,
        retry_after_s=verdict.retry_after_s,
    )


def _tell(life: RequestLife) -> None:
    waiter = life.waiter
    if waiter is not None:
        life.waiter = None
        waiter(life)


def _lane(request: LLMRequest, subset: tuple[str, ...] | None) -> tuple[str, tuple[str, ...] | None]:
    """Requests interchangeable for placement: the same target model and the same subset hint."""
    return (request.target_model, subset)


def fairness_id_of(headers: Mapping[str, str]) -> str:
    """The request's flow within its band: the fairness-ID header (either name), else the default flow."""
    return (
        headers.get(wire.FAIRNESS_ID_HEADER)
        or headers.get(wire.FAIRNESS_ID_HEADER_LLMD)
        or DEFAULT_FAIRNESS_ID
    )


def band_priority(request: LLMRequest) -> int:
    """The request's priority band: its InferenceObjective's priority; without an objective, its
    InferenceModel criticality (Critical 1, Standard 0, Sheddable -1) so Critical goes first."""
    if request.objective is not None:
        return request.priority
    if request.criticality is Criticality.CRITICAL:
        return 1
    if request.criticality is Criticality.SHEDDABLE:
        return -1
    return 0


def parse_body(body: bytes) -> dict[str, Any]:
    """The request body as a JSON object, or a 400."""
    try:
        payload = json.loads(body)
    except (ValueError, UnicodeDecodeError, RecursionError) as err:  # RecursionError: nesting too deep
        raise EppError(ErrorCode.BAD_REQUEST, "Error unmarshaling request body", reason="bad-json") from err
    if not isinstance(payload, dict):
        raise EppError(ErrorCode.BAD_REQUEST, "Error unmarshaling request body", reason="bad-json")
    return payload


_DECODER = json.JSONDecoder()
_WHITESPACE = " \t\n\r"


def replace_top_level_string(body: bytes, key: str, value: str) -> bytes:
    """`body` with only the top-level `key`'s value replaced, every other byte kept.

    Clients' number formats, spacing and key order survive a model rewrite. The body was
    already parsed as a JSON object; the last occurrence of `key` is the one that counts.
    """
    text = body.decode("utf-8")
    span: tuple[int, int] | None = None
    index = _skip(text, 0)
    if text[index] != "{":  # pragma: no cover - parse_body accepted only objects
        raise ValueError("not a JSON object")
    index = _skip(text, index + 1)
    while index < len(text) and text[index] != "}":
        name, index = _DECODER.raw_decode(text, index)
        index = _skip(text, _skip(text, index) + 1)  # past ':'
        _, end = _DECODER.raw_decode(text, index)
        if name == key:
            span = (index, end)
        index = _skip(text, end)
        if text[index] == ",":
            index = _skip(text, index + 1)
    if span is None:  # pragma: no cover - the caller read `key` from this body
        raise ValueError(f"no top-level {key!r}")
    replacement = json.dumps(value, ensure_ascii=False)
    return (text[: span[0]] + replacement + text[span[1] :]).encode("utf-8")


def _skip(text: str, index: int) -> int:
    while index < len(text) and text[index] in _WHITESPACE:
        index += 1
    return index


def prompt_text(payload: Mapping[str, Any]) -> str:
    """Text for prefix hashing: completions `prompt`, or chat `messages` in ChatML form."""
    messages = payload.get("messages")
    if isinstance(messages, list):
        parts = []
        for message in messages:
            if not isinstance(message, dict):
                continue
            role = message.get("role")
            role_text = role if isinstance(role, str) else ""
            content = _content_text(message.get("content"))
            parts.append(f"<|im_start|>{role_text}\n{content}<|im_end|>\n")
        return "".join(parts)
    prompt = payload.get("prompt")
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list) and all(isinstance(p, str) for p in prompt):
        return "".join(prompt)
    return ""


def _content_text(content: object) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for part in content:
            if isinstance(part, dict) and isinstance(part.get("text"), str):
                texts.append(part["text"])
        return "".join(texts)
    return ""


def select_candidates(snapshot: Snapshot, subset: Sequence[str] | None) -> tuple[EndpointState, ...]:
    """Ready endpoints ∩ subset hint; none → 503 (never pick outside the hint)."""
    candidates = snapshot.endpoints
    if subset is not None:
        hint = SubsetHint.parse(subset)
        candidates = tuple(state for state in candidates if hint.allows(state))
    if not candidates:
        raise EppError(
            ErrorCode.SERVICE_UNAVAILABLE,
            "failed to find candidate pods for serving the request",
            reason="no-endpoints",
        )
    return candidates


def _placeable(
    flow: FlowControl, life: RequestLife, candidates: Sequence[EndpointState], now: float
) -> Sequence[EndpointState]:
    """The candidates that can start `life`'s request now: the gate's, none while the pool keeps
    its last free batch slots for flows within their share and `life`'s flow is over its own."""
    request = life.request
    assert request is not None
    placeable = flow.gate.placeable(request, candidates, now)
    if placeable and _held_for_reserve(flow, life, candidates, now):
        return ()
    return placeable


def _held_for_reserve(
    flow: FlowControl, life: RequestLife, candidates: Sequence[EndpointState], now: float
) -> bool:
    """`life`'s flow asks for more than its fair share while the pool keeps its reserve
    (`flowcontrol/fairshare.py`)."""
    shares, judge = flow.shares, flow.judge
    if shares is None or judge is None or not flow.gate.is_overloaded(now):
        return False
    if not shares.over_share(life.priority, life.fairness_id, now):
        return False
    return _reserve_held(flow, candidates, now)


def _reserve_held(flow: FlowControl, candidates: Sequence[EndpointState], now: float) -> bool:
    """The overloaded pool has no more free batch slots than its reserve."""
    if flow.shares is None or not flow.gate.is_overloaded(now):
        return False
    slots = flow.gate.batch_slots(candidates, now)
    return slots is not None and slots[0] <= flow.shares.settings.reserve(slots[1])


def _full_for(flow: FlowControl, life: RequestLife, candidates: Sequence[EndpointState], now: float) -> bool:
    """The pool cannot start `life`'s request: saturated, or its flow is held for the reserve."""
    return flow.gate.saturated(candidates, now) or _held_for_reserve(flow, life, candidates, now)
