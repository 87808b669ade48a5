"""`predicted-ttft-scorer`: each pod scored by the TTFT the request is predicted to see there.

predicted = hit TTFT + per-request delay × load + the price of bringing the adapter there (nothing
when it is in a GPU slot, a host-memory load when the pod holds it in host memory, a storage load
otherwise), every term learned per pod (`scheduling.costs`). Score = least predicted over the
candidates / this pod's predicted: the fastest pod scores 1, one predicted twice as slow 0.5.

So the affinity term is what a miss costs on that pod: where loads are cheap (adapters in host
memory) load decides and an adapter spreads over the pool; where they are dear (storage) a pod
that holds it wins until its queue costs more than the load. A pod whose every slot is held by
adapters with requests in flight adds `slotWaitFactor` × its hit TTFT: the request would wait there
for a slot to turn over.

As a `RoutingObserver` it notes, for each pick, the pod's load and where the adapter stood; the
routing ledger hands the scheduler's estimator (`cost_learning`) each request's time to first byte
as the request ends.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from epp.picker.datastore.types import EndpointState
from epp.picker.scheduling.cost_learning import note_routed
from epp.picker.scheduling.costs import CostEstimator
from epp.picker.scheduling.framework import ScheduleContext, is_base_model
from epp.picker.scheduling.scorers.load_signals import effective_loads
from epp.picker.scheduling.state import SchedulerState
from epp.picker.scheduling.types import LLMRequest


@dataclass(frozen=True, slots=True)
class PredictedTtftScorer:
    state: SchedulerState = field(repr=False)
    estimator: CostEstimator
    name: str = "predicted-ttft-scorer"
    slot_wait_factor: float = 1.0

    def score(self, ctx: ScheduleContext, endpoints: Sequence[EndpointState]) -> list[float]:
        loads = effective_loads(ctx, endpoints)
        state = ctx.state
        base = is_base_model(ctx.request, state, endpoints)
        adapter = ctx.request.target_model
        residency = state.residency
        pods = residency.pods
        adapter_count = state.inflight.adapter_count
        own = self.estimator.pods.get
        pool = self.estimator.pool
        wait = self.slot_wait_factor
        predicted: list[float] = []
        append = predicted.append
        # predict(tier_of(...), load) inlined: this runs for every candidate of every decision.
        for e, load in zip(endpoints, loads, strict=True):
            name = e.endpoint.name
            costs = own(name) or pool
            value = costs.hit_s + costs.per_load_s * load
            if not base:
                pod = pods.get(name)
                if pod is None:
                    if adapter_count(name, adapter) == 0:
                        value += costs.storage_load_s
                elif adapter not in pod.gpu and adapter not in pod.observed_active:
                    value += costs.host_load_s if adapter in pod.cpu else costs.storage_load_s
                    if len(pod.gpu) >= pod.slots and residency.victim(name, pod) is None:
                        value += wait * costs.hit_s  # every slot held by adapters in flight
            append(value)
        best = min(predicted)
        return [best / p if p > 0 else 1.0 for p in predicted]

    def on_routed(self, request: LLMRequest, endpoint: EndpointState, now: float) -> None:
        note_routed(self.state, self.estimator, request, endpoint)

    def forget(self, names: list[str]) -> None:
        self.estimator.forget(names)
