"""A small, faithful Scheduler for director and ext_proc tests (the real ones: epp.picker.scheduling)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from epp.clock import FakeClock
from epp.errors import EppError, ErrorCode
from epp.picker.datastore.store import Datastore
from epp.picker.datastore.types import (
    EndpointState,
    InferenceModel,
    InferenceObjective,
    Metrics,
    PodInfo,
    Pool,
    Snapshot,
)
from epp.picker.scheduling.inflight import Flight
from epp.picker.scheduling.state import SchedulerState
from epp.picker.scheduling.types import LLMRequest, SchedulingResult


def _fresh_state() -> SchedulerState:
    return SchedulerState.create(seed=0, staleness_threshold_s=2.0)


@dataclass
class FakeScheduler:
    """Picks candidates in name order; `max_endpoints` of them, primary first. Records every hook call.

    `routed` holds each `on_routed` call; `completed` each request its routing ledger released (the
    director finishes a dispatched request there), both as (request key, endpoint name): the key is
    the request's life's key (`LLMRequest.request_id`), the endpoint the one it was counted on.
    """

    max_endpoints: int = 1
    exhausted: bool = False
    name: str = "fake"
    state: SchedulerState = field(default_factory=_fresh_state)
    scheduled: list[tuple[LLMRequest, tuple[str, ...]]] = field(default_factory=list)
    routed: list[tuple[str, str]] = field(default_factory=list)  # (request key, primary name)
    completed: list[tuple[str, str]] = field(default_factory=list)  # (request key, endpoint)

    def __post_init__(self) -> None:
        self.state.ledger.listen(self._on_flight)

    def schedule(
        self, request: LLMRequest, candidates: Sequence[EndpointState], snapshot: Snapshot, now: float
    ) -> SchedulingResult:
        self.scheduled.append((request, tuple(c.name for c in candidates)))
        if self.exhausted:
            raise EppError(ErrorCode.RESOURCE_EXHAUSTED, "failed to find a target endpoint")
        chosen = sorted(candidates, key=lambda c: c.name)[: self.max_endpoints]
        return SchedulingResult(endpoints=tuple(chosen), reason="fake")

    def on_routed(self, request: LLMRequest, result: SchedulingResult, now: float) -> None:
        self.routed.append((request.request_id, result.primary.name))

    def _on_flight(self, flight: Flight, finished: bool, now: float) -> None:
        if finished:
            self.completed.append((flight.key, flight.endpoint))


def pool_datastore(
    pod_ips: Sequence[str] = ("10.0.0.1", "10.0.0.2"),
    *,
    target_ports: tuple[int, ...] = (8000,),
    models: Sequence[InferenceModel] = (),
    objectives: Sequence[InferenceObjective] = (),
    clock: FakeClock | None = None,
) -> Datastore:
    """A datastore holding pool `pool` in `default` with one ready pod per IP (`pod-0`, `pod-1`, ...)."""
    store = Datastore(clock if clock is not None else FakeClock())
    store.set_pool(
        Pool(name="pool", namespace="default", selector={"app": "vllm"}, target_ports=target_ports)
    )
    store.replace_pods(
        PodInfo(name=f"pod-{i}", namespace="default", ip=ip, labels={"app": "vllm"})
        for i, ip in enumerate(pod_ips)
    )
    store.replace_models(models)
    store.replace_objectives(objectives)
    return store


BASE_MODEL_NAME = "base"  # the served model name `scrape_lora_slots` reports: other models are adapters


def scrape_lora_slots(
    store: Datastore, now: float, *, max_lora: int = 1, waiting: int = 0, running: int = 0
) -> None:
    """Give every endpoint a fresh scrape: LoRA on with `max_lora` slots, serving `base`, `waiting`
    requests in its queue (above the saturation detector's 5, flow control's gate finds no headroom)
    and `running` in its batch."""
    for endpoint in store.endpoints():
        store.update_metrics(
            endpoint.name,
            Metrics(
                updated_at=now,
                waiting_requests=waiting,
                running_requests=running,
                lora_enabled=True,
                max_lora=max_lora,
                served_model_name=BASE_MODEL_NAME,
            ),
        )
