"""`load-scorer`: prefer pods with less outstanding work than the other candidates.

load = waiting + routed-since-scrape + runningWeight · running (see `load_signals`), and
score = (min load + queueScale) / (load + queueScale) over the candidates: the least
loaded pod scores 1, a pod with twice its load (plus `queueScale`) scores 0.5. Relative,
so five busy pods and an idle one differ however busy the pool is; softened by
`queueScale`, so a one-request difference between two idle pods does not outweigh
adapter affinity.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from epp.picker.datastore.types import EndpointState
from epp.picker.scheduling.framework import ScheduleContext
from epp.picker.scheduling.scorers.load_signals import effective_loads, effective_queues


@dataclass(frozen=True, slots=True)
class LoadScorer:
    name: str = "load-scorer"
    queue_scale: float = 8.0  # softening, in requests
    running_weight: float = 1.0  # a running request's weight relative to a waiting one

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
        scale = self.queue_scale
        floor = min(loads) + scale
        return [floor / (load + scale) for load in loads]
