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
    PodInfo,
    Pool,
    Snapshot,
)
from epp.picker.scheduling.types import LLMRequest, SchedulingResult


@dataclass
class FakeScheduler:
    """Picks candidates in name order; `max_endpoints` of them, primary first. Records every hook call."""

    max_endpoints: int = 1
    exhausted: bool = False
    name: str = "fake"
    scheduled: list[tuple[LLMRequest, tuple[str, ...]]] = field(default_factory=list)
    routed: list[tuple[str, str]] = field(default_factory=list)  # (request_id, primary name)
    completed: list[tuple[str, str]] = field(default_factory=list)  # (request_id, endpoint)

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

    def on_completed(self, request: LLMRequest, endpoint_name: str, now: float) -> None:
        self.completed.append((request.request_id, endpoint_name))


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
