"""`load-scorer`: prefer pods with little queued work, counting what we sent since the last scrape.

score = 1 / (1 + load / queueScale), load = waiting + routed-since-scrape + runningWeight · running.
Absolute rather than normalised over candidates, so a one-request difference between two
idle pods does not outweigh adapter affinity.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from epp.datastore.types import EndpointState
from epp.scheduling.framework import ScheduleContext
from epp.scheduling.scorers.load_signals import effective_queues


@dataclass(frozen=True, slots=True)
class LoadScorer:
    name: str = "load-scorer"
    queue_scale: float = 8.0  # load at which the score is 0.5
    running_weight: float = 0.25

    def score(self, ctx: ScheduleContext, endpoints: Sequence[EndpointState]) -> list[float]:
        queues = effective_queues(ctx, endpoints)
        scale = self.queue_scale
        rw = self.running_weight
        out: list[float] = []
        for e, q in zip(endpoints, queues, strict=True):
            m = e.metrics
            load = q + (rw * m.running_requests if m is not None else 0.0)
            out.append(1.0 / (1.0 + load / scale))
        return out
