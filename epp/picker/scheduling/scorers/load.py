"""`load-scorer`: prefer pods with less outstanding work than the other candidates.

load = waiting + routed-since-scrape + runningWeight · running (see `load_signals`), and
score = (min load + queueScale) / (load + queueScale) over the candidates: the least
loaded pod scores 1, a pod with twice its load (plus `queueScale`) scores 0.5. Relative,
so five busy pods and an idle one differ however busy the pool is; softened by
`queueScale`, so a one-request difference between two idle pods does not outweigh
adapter affinity.

`prefillWeight` (0, off, by default) adds that many requests of load per request routed to the pod
within its idle TTFT, learned from the EPP's own requests (`cost_learning`): such a request is
most likely still in its prefill, which the next request's prefill there queues behind, while the
scrape shows it as one more running request at most. Round robin spaces a pod's arrivals evenly and
gets this for free; a load-based pick does not, and loses to it where prefill steps are long.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from epp.picker.datastore.types import EndpointState
from epp.picker.scheduling.cost_learning import note_routed
from epp.picker.scheduling.costs import CostEstimator
from epp.picker.scheduling.framework import ScheduleContext
from epp.picker.scheduling.scorers.load_signals import effective_loads, effective_queues
from epp.picker.scheduling.state import SchedulerState
from epp.picker.scheduling.types import LLMRequest


@dataclass(frozen=True, slots=True)
class LoadScorer:
    name: str = "load-scorer"
    queue_scale: float = 8.0  # softening, in requests
    running_weight: float = 1.0  # a running request's weight relative to a waiting one
    prefill_weight: float = 0.0  # a request still in its prefill, relative to a waiting one (0: off)
    state: SchedulerState | None = field(default=None, repr=False)  # needed with `costs`
    costs: CostEstimator | None = None  # learned per-pod costs: the prefill window (set with the weight)

    def score(self, ctx: ScheduleContext, endpoints: Sequence[EndpointState]) -> list[float]:
        if not endpoints:
            return []
        rw = self.running_weight
        if rw == 1.0:
            loads = effective_loads(ctx, endpoints)  # the same sum, shared with other scorers
        else:
            loads = [
                q + (rw * e.metrics.running_requests if e.metrics is not None else 0.0)
                for e, q in zip(endpoints, effective_queues(ctx, endpoints), strict=True)
            ]
        costs = self.costs
        if costs is not None and self.prefill_weight > 0:
            loads = self._with_prefills(ctx, endpoints, loads, costs)
        scale = self.queue_scale
        floor = min(loads) + scale
        return [floor / (load + scale) for load in loads]

    def _with_prefills(
        self,
        ctx: ScheduleContext,
        endpoints: Sequence[EndpointState],
        loads: list[float],
        costs: CostEstimator,
    ) -> list[float]:
        """Each pod's load plus `prefillWeight` per request routed there within its learned idle
        TTFT: such a request is most likely still in its prefill, which the next request's prefill
        queues behind (the scrape shows it only as one more running request)."""
        recently = ctx.state.inflight.routed_recently
        now = ctx.now
        weight = self.prefill_weight
        out: list[float] = []
        for e, load in zip(endpoints, loads, strict=True):
            name = e.endpoint.name
            out.append(load + weight * recently(name, now - costs.pod(name).hit_s))
        return out

    def on_routed(self, request: LLMRequest, endpoint: EndpointState, now: float) -> None:
        """With the prefill term: note the pick, so its outcome teaches this pod's idle TTFT."""
        if self.costs is not None and self.state is not None:
            note_routed(self.state, self.costs, request, endpoint)
