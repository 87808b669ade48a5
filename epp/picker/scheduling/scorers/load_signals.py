"""Per-decision load signals shared by several scorers, computed once and memoised on the context."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from epp.picker.datastore.types import EndpointState
from epp.picker.scheduling.framework import ScheduleContext

_MEMO_KEY = "load_signals"


@dataclass(frozen=True, slots=True)
class _Memo:
    endpoints: Sequence[EndpointState]
    queues: list[float]
    loads: list[float]


def _signals(ctx: ScheduleContext, endpoints: Sequence[EndpointState]) -> _Memo:
    cached = ctx.memo.get(_MEMO_KEY)
    if isinstance(cached, _Memo) and cached.endpoints is endpoints:
        return cached
    inflight = ctx.state.inflight
    count = inflight.count
    routed_since = inflight.routed_since
    queues: list[float] = []
    loads: list[float] = []
    for e in endpoints:
        m = e.metrics
        if m is None:
            q = float(count(e.endpoint.name))
            queues.append(q)
            loads.append(q)
        else:
            q = float(m.waiting_requests + routed_since(e.endpoint.name, m.updated_at))
            queues.append(q)
            loads.append(q + m.running_requests)
    memo = _Memo(endpoints, queues, loads)
    ctx.memo[_MEMO_KEY] = memo
    return memo


def effective_queues(ctx: ScheduleContext, endpoints: Sequence[EndpointState]) -> list[float]:
    """Waiting queue as scraped plus requests we routed since that scrape, per endpoint.

    Before the first scrape an endpoint's queue is everything we have in flight there.
    """
    return _signals(ctx, endpoints).queues


def effective_loads(ctx: ScheduleContext, endpoints: Sequence[EndpointState]) -> list[float]:
    """Outstanding requests per endpoint: effective waiting queue plus running requests.

    vLLM runs up to `max_num_seqs` (256) at once, so under moderate load the waiting queue
    stays 0 however busy a pod is; the running batch is what slows each step. Before the
    first scrape an endpoint's load is everything we have in flight there.
    """
    return _signals(ctx, endpoints).loads
