"""`queue-scorer` (upstream): `(maxQ − q) / (maxQ − minQ)` over candidates' waiting queues; all equal → 1."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from epp.picker.datastore.types import EndpointState
from epp.picker.scheduling.framework import ScheduleContext


def min_max_scores(values: Sequence[float]) -> list[float]:
    """Lower is better, normalised over the given values; all equal → 1.0 each."""
    low = min(values)
    high = max(values)
    if high == low:
        return [1.0] * len(values)
    span = high - low
    return [(high - v) / span for v in values]


@dataclass(frozen=True, slots=True)
class QueueScorer:
    name: str = "queue-scorer"

    def score(self, ctx: ScheduleContext, endpoints: Sequence[EndpointState]) -> list[float]:
        return min_max_scores([float(e.metrics.waiting_requests) if e.metrics else 0.0 for e in endpoints])


@dataclass(frozen=True, slots=True)
class RunningRequestsScorer:
    """`running-requests-size-scorer` (upstream v1.5): the queue formula on running requests."""

    name: str = "running-requests-size-scorer"

    def score(self, ctx: ScheduleContext, endpoints: Sequence[EndpointState]) -> list[float]:
        return min_max_scores([float(e.metrics.running_requests) if e.metrics else 0.0 for e in endpoints])
