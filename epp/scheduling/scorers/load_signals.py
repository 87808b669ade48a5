"""Per-decision load signals shared by several scorers, computed once and memoised on the context."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from epp.datastore.types import EndpointState
from epp.scheduling.framework import ScheduleContext


@dataclass(frozen=True, slots=True)
class _Memo:
    endpoints: Sequence[EndpointState]
    queues: list[float]


def effective_queues(ctx: ScheduleContext, endpoints: Sequence[EndpointState]) -> list[float]:
    """Waiting queue as scraped plus requests we routed since that scrape, per endpoint.

    Before the first scrape an endpoint's queue is everything we have in flight there.
    """
    cached = ctx.memo.get("effective_queues")
    if isinstance(cached, _Memo) and cached.endpoints is endpoints:
        return cached.queues
    inflight = ctx.state.inflight
    queues: list[float] = []
    for e in endpoints:
        m = e.metrics
        if m is None:
            queues.append(float(inflight.count(e.endpoint.name)))
        else:
            queues.append(float(m.waiting_requests + inflight.routed_since(e.endpoint.name, m.updated_at)))
    ctx.memo["effective_queues"] = _Memo(endpoints, queues)
    return queues


@dataclass(frozen=True, slots=True)
class _LoadMemo:
    endpoints: Sequence[EndpointState]
    loads: list[float]


def effective_loads(ctx: ScheduleContext, endpoints: Sequence[EndpointState]) -> list[float]:
    """Outstanding requests per endpoint: effective waiting queue plus running requests.

    vLLM runs up to `max_num_seqs` (256) at once, so under moderate load the waiting queue
    stays 0 however busy a pod is; the running batch is what slows each step. Before the
    first scrape an endpoint's load is everything we have in flight there.
    """
    cached = ctx.memo.get("effective_loads")
    if isinstance(cached, _LoadMemo) and cached.endpoints is endpoints:
        return cached.loads
    queues = effective_queues(ctx, endpoints)
    loads = [
        q + (e.metrics.running_requests if e.metrics is not None else 0.0)
        for e, q in zip(endpoints, queues, strict=True)
    ]
    ctx.memo["effective_loads"] = _LoadMemo(endpoints, loads)
    return loads
