"""Where waiting requests wait: priority bands, flows within a band, lanes within a flow.

- A **band** holds every flow of one priority. Bands are served strictly by priority, highest first.
- A **flow** is one fairness ID (a tenant) within a band. The band's fairness policy orders its
  flows: `global-strict` (the best head across every flow, as if one queue), `round-robin` (one
  request from each backlogged flow in turn), `vtc` (virtual token counter: the backlogged flow
  that was given the fewest request bytes, divided by its weight, goes first; a flow that becomes
  backlogged starts level with the least-served one, so idling earns no credit).
- A **lane** holds the requests of one flow that are interchangeable for placement: the same
  target model and the same subset hint. When a lane's head cannot be placed, nothing behind it in
  that lane can either, so a dispatch pass skips the whole lane; other lanes (other adapters) pass
  it. This is what lets a request whose adapter has a slot go while another adapter waits for one.
- The band's ordering policy orders requests: `fcfs` (arrival at the queue), `edf` (earliest
  deadline first; a request's deadline is its arrival plus its TTL), or ours, `total-wait`: the
  lane whose requests have waited longest all together goes first. A lane is an adapter, so when
  a LoRA slot frees, it goes to the adapter whose waiting requests it relieves most (many requests,
  or old ones); one load then serves all of them. A lane whose oldest request has waited two
  seconds goes first (oldest first), so a lone request never waits behind busier lanes for long.

Pure data structures: no clock, no I/O; times are the caller's.
"""

from __future__ import annotations

import heapq
from collections.abc import Hashable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Generic, TypeVar

T = TypeVar("T")

FAIRNESS_POLICIES = ("global-strict", "round-robin", "vtc")
ORDERING_POLICIES = ("fcfs", "edf", "total-wait")
# total-wait: a lane whose oldest request has waited this long goes before the others, oldest first.
# Without it, with hundreds of adapters a lone request loses to busier lanes again and again
# (`epp bench`, seed 1: zipf-500's P99 TTFT 6.9 s under fcfs, 11.5 s under plain total-wait, 6.9 s
# with a 2 s cap). 1 s kept P99 TTFT a little lower but cost e2e P99 on azure-conv (35.2 s against
# 27.0 s with 2 s, over seeds 1-3 31.9 s against 29.2 s).
TOTAL_WAIT_AGE_CAP_S = 2.0


class QueueItem(Generic[T]):
    """One waiting request: its payload, where it waits and its ordering key."""

    __slots__ = (
        "cost",
        "deadline",
        "enqueued_at",
        "fairness_id",
        "lane",
        "payload",
        "priority",
        "queued",
        "seq",
        "size",
    )

    def __init__(
        self,
        payload: T,
        *,
        fairness_id: str,
        priority: int,
        lane: Hashable,
        size: int,
        enqueued_at: float,
        deadline: float,
        seq: int,
        cost: float = 0.0,
    ) -> None:
        self.payload = payload
        self.fairness_id = fairness_id
        self.priority = priority
        self.lane = lane
        self.size = size
        self.enqueued_at = enqueued_at
        self.deadline = deadline
        self.seq = seq
        # What dispatching it charges its flow's fairness counter (vtc): its prompt tokens, or its
        # bytes where the caller counts none; 0: its size.
        self.cost = cost
        self.queued = True  # False once dispatched or removed (heaps drop such entries lazily)


def ordering_key(policy: str, item: QueueItem[T]) -> tuple[float, int]:
    if policy == "edf":
        return (item.deadline, item.seq)
    return (item.enqueued_at, item.seq)


class Lane(Generic[T]):
    """Interchangeable requests of one flow, in ordering-policy order."""

    __slots__ = ("_heap", "count", "enqueued_sum", "key")

    def __init__(self, key: Hashable) -> None:
        self.key = key
        self._heap: list[tuple[tuple[float, int], QueueItem[T]]] = []
        self.count = 0
        self.enqueued_sum = 0.0  # of its items' enqueue times: their total wait is count × now − this

    def push(self, order: tuple[float, int], item: QueueItem[T]) -> None:
        heapq.heappush(self._heap, (order, item))
        self.count += 1
        self.enqueued_sum += item.enqueued_at

    def rank(self, policy: str, now: float) -> tuple[float, float, float]:
        """Where the lane's head stands among other lanes' heads (lower goes first)."""
        order = self.head_order()
        if policy == "total-wait":
            if now - order[0] >= TOTAL_WAIT_AGE_CAP_S:
                return (0.0, order[0], order[1])  # waited too long already: oldest first, before any other
            return (1.0, -(self.count * now - self.enqueued_sum), order[1])
        return (0.0, order[0], order[1])

    def head(self) -> QueueItem[T] | None:
        heap = self._heap
        while heap and not heap[0][1].queued:
            heapq.heappop(heap)
        return heap[0][1] if heap else None

    def left(self) -> None:
        """One of its items left from inside the lane (expired, or its client left): once its heap
        holds more gone entries than waiting ones, rebuild it, so memory follows what waits."""
        if len(self._heap) > 2 * self.count + 16:
            self._heap = [entry for entry in self._heap if entry[1].queued]
            heapq.heapify(self._heap)

    def head_order(self) -> tuple[float, int]:
        self.head()
        return self._heap[0][0]

    def __iter__(self) -> Iterator[QueueItem[T]]:
        return (item for _, item in sorted(self._heap) if item.queued)


@dataclass(slots=True)
class Flow(Generic[T]):
    """One fairness ID's requests in one band."""

    fairness_id: str
    weight: float = 1.0
    lanes: dict[Hashable, Lane[T]] = field(default_factory=dict)
    count: int = 0
    size: int = 0
    turn: int = 0  # round-robin: requests dispatched, offset to the band's round when it became backlogged
    counter: float = 0.0  # vtc: tokens served ÷ weight, lifted likewise


@dataclass(slots=True)
class Band(Generic[T]):
    """Every flow of one priority, with the band's policies and limits."""

    priority: int
    fairness: str = "global-strict"
    ordering: str = "fcfs"
    max_requests: int = 0  # 0: unlimited
    max_bytes: int = 0  # 0: unlimited
    weights: Mapping[str, float] = field(default_factory=dict)  # vtc: fairness ID -> weight
    default_weight: float = 1.0
    flows: dict[str, Flow[T]] = field(default_factory=dict)
    count: int = 0
    size: int = 0

    def flow_rank(self, flow: Flow[T]) -> tuple[float, int]:
        """The fairness policy's rank of `flow` (lower goes first); global-strict ranks all alike.
        Under vtc, on a tie the flow with fewer requests waiting goes first."""
        if self.fairness == "round-robin":
            return (float(flow.turn), 0)
        if self.fairness == "vtc":
            return (flow.counter, flow.count)
        return (0.0, 0)

    def newcomer_rank(self, fairness_id: str) -> tuple[float, int]:
        """The rank a flow with nothing waiting would get with its first request (see `add`)."""
        others = [f for f in self.flows.values() if f.count]
        if self.fairness == "round-robin":
            return (float(min((f.turn for f in others), default=0)), 0)
        if self.fairness == "vtc":
            return (min((f.counter for f in others), default=0.0), 1)
        return (0.0, 0)

    def charge(self, fairness_id: str, cost: float) -> None:
        """Count `cost` more tokens served to `fairness_id` (vtc: output tokens as a request finishes)."""
        if self.fairness != "vtc" or cost <= 0:
            return
        flow = self.flows.get(fairness_id)
        if flow is not None:  # an idle flow keeps no counter (see `add`)
            flow.counter += cost / flow.weight

    def add(self, item: QueueItem[T]) -> None:
        flow = self.flows.get(item.fairness_id)
        if flow is None:
            weight = self.weights.get(item.fairness_id, self.default_weight)
            flow = self.flows[item.fairness_id] = Flow(item.fairness_id, weight)
            # A flow that becomes backlogged starts level with the least-served backlogged one:
            # idling earns no credit. (Its counter before does not count either, as upstream's
            # vtc: a tenant that sends now and then is never held behind one that floods.)
            rank = self.newcomer_rank(item.fairness_id)
            flow.turn = int(rank[0]) if self.fairness == "round-robin" else 0
            flow.counter = rank[0] if self.fairness == "vtc" else 0.0
        lane = flow.lanes.get(item.lane)
        if lane is None:
            lane = flow.lanes[item.lane] = Lane(item.lane)
        lane.push(ordering_key(self.ordering, item), item)
        flow.count += 1
        flow.size += item.size
        self.count += 1
        self.size += item.size

    def remove(self, item: QueueItem[T], *, dispatched: bool) -> None:
        """Take `item` out (dispatched, expired or its client left); its heap entry goes lazily."""
        item.queued = False
        flow = self.flows[item.fairness_id]
        lane = flow.lanes[item.lane]
        lane.count -= 1
        lane.enqueued_sum -= item.enqueued_at
        flow.count -= 1
        flow.size -= item.size
        self.count -= 1
        self.size -= item.size
        if dispatched:
            flow.turn += 1
            flow.counter += (item.cost or max(1, item.size)) / flow.weight
        if lane.count == 0:
            del flow.lanes[item.lane]
        else:
            lane.left()
        if flow.count == 0:
            del self.flows[item.fairness_id]  # an idle flow keeps no counter, as upstream's vtc

    def lanes(self) -> Iterator[tuple[Flow[T], Lane[T]]]:
        for flow in self.flows.values():
            for lane in flow.lanes.values():
                yield flow, lane
