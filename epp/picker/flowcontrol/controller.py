"""The flow controller: requests wait here, not on a pod, until some endpoint can start them.

`enqueue` files a request in its band and flow (or refuses it when a limit is reached);
`dispatch` runs one pass over everything waiting, highest band first, each band's flows in its
fairness order and each flow's requests in its ordering, asking `place` of each lane's head. A
head that cannot be placed now blocks only its lane for the rest of the pass. `expire` takes out
requests whose TTL ran out; `overdue` those that waited longer than a bound (the overload
judge's); `take_below` every request under a priority (shedding); `remove` one whose client left.
`position` says how many requests a newcomer would wait behind, for the judge's estimate.

Pure and synchronous: the caller (the director) calls `dispatch` whenever capacity may have
freed (a request finished, a scrape arrived, a peer's batch, a timer) and does the placing.
"""

from __future__ import annotations

import enum
import heapq
import itertools
from collections.abc import Callable, Hashable, Iterator
from dataclasses import dataclass
from typing import Generic, TypeVar

from epp.picker.flowcontrol.queues import Band, Flow, Lane, QueueItem, ordering_key
from epp.picker.flowcontrol.settings import BandSettings, FlowControlSettings

T = TypeVar("T")


class Placement(enum.Enum):
    PLACED = "placed"  # dispatched: it left the queue
    BLOCKED = "blocked"  # nowhere to start it now: its lane waits
    REFUSED = "refused"  # it can never be placed as it is (no endpoint at all): it left the queue


class Rejection(enum.Enum):
    """Why `enqueue` refused a request."""

    BAND_FULL = "band-full"  # the band holds its maximum requests or bytes
    POOL_FULL = "pool-full"  # every band together holds the global maximum


@dataclass(frozen=True, slots=True)
class PassResult(Generic[T]):
    """What one dispatch pass did."""

    placed: list[QueueItem[T]]
    refused: list[QueueItem[T]]
    blocked: list[QueueItem[T]]  # the head of every lane that could not be placed, best first


@dataclass(frozen=True, slots=True)
class LaneView:
    """One lane (a flow's requests for one target) as `/debug/flow-control` shows it."""

    priority: int
    fairness_id: str
    lane: Hashable
    requests: int
    oldest_wait_s: float
    total_wait_s: float


@dataclass(frozen=True, slots=True)
class FlowView:
    """One flow (a fairness ID in one band) as `/debug/flow-control` shows it."""

    priority: int
    fairness_id: str
    requests: int
    counter: float  # vtc: tokens served ÷ weight since it last became backlogged; round-robin: turns
    ahead: int  # requests a newcomer of this flow would be dispatched after (`position`)


@dataclass(frozen=True, slots=True)
class BandView:
    """One band as metrics and `/debug/flow-control` show it."""

    priority: int
    requests: int
    bytes: int
    flows: int
    oldest_wait_s: float | None


class FlowController(Generic[T]):
    """Queues by priority band and flow; see the module docstring. Not thread-safe."""

    def __init__(self, settings: FlowControlSettings) -> None:
        self.settings = settings
        self._bands: dict[int, Band[T]] = {}
        self._order: list[int] = []  # priorities, highest first
        self._items: dict[int, QueueItem[T]] = {}  # id(payload) -> its item
        self._deadlines: list[tuple[float, int, QueueItem[T]]] = []
        self._seq = itertools.count()
        self.count = 0
        self.size = 0

    def __len__(self) -> int:
        return self.count

    # -- in ---------------------------------------------------------------------------------

    def enqueue(
        self,
        payload: T,
        *,
        fairness_id: str,
        priority: int,
        lane: Hashable,
        size: int,
        now: float,
        ttl_s: float,
        cost: float = 0.0,
    ) -> QueueItem[T] | Rejection:
        """File `payload`, or say which limit refuses it. `cost`: what dispatching it charges its
        flow's fairness counter (its prompt tokens; 0: its size in bytes)."""
        if id(payload) in self._items:
            raise ValueError("this request is queued already")
        band = self._band(priority)
        settings = self.settings
        if (band.max_requests and band.count >= band.max_requests) or (
            band.max_bytes and band.size + size > band.max_bytes
        ):
            return Rejection.BAND_FULL
        if (settings.max_requests and self.count >= settings.max_requests) or (
            settings.max_bytes and self.size + size > settings.max_bytes
        ):
            return Rejection.POOL_FULL
        deadline = now + ttl_s if ttl_s > 0 else float("inf")
        item = QueueItem(
            payload,
            fairness_id=fairness_id,
            priority=priority,
            lane=lane,
            size=size,
            enqueued_at=now,
            deadline=deadline,
            seq=next(self._seq),
            cost=cost,
        )
        band.add(item)
        self._items[id(payload)] = item
        if deadline != float("inf"):
            heapq.heappush(self._deadlines, (deadline, item.seq, item))
        self.count += 1
        self.size += size
        return item

    # -- out --------------------------------------------------------------------------------

    def dispatch(self, now: float, place: Callable[[QueueItem[T]], Placement]) -> PassResult[T]:
        """One pass: place what can be placed, best first; see the module docstring."""
        placed: list[QueueItem[T]] = []
        refused: list[QueueItem[T]] = []
        blocked: list[QueueItem[T]] = []
        for priority in list(self._order):
            band = self._bands[priority]
            if band.count:
                self._dispatch_band(band, now, place, placed, refused, blocked)
        return PassResult(placed, refused, blocked)

    def _dispatch_band(
        self,
        band: Band[T],
        now: float,
        place: Callable[[QueueItem[T]], Placement],
        placed: list[QueueItem[T]],
        refused: list[QueueItem[T]],
        blocked: list[QueueItem[T]],
    ) -> None:
        heads: list[tuple[tuple[float, int], tuple[float, float, float], int, Flow[T], Lane[T]]] = []
        tie = itertools.count()
        ordering = band.ordering
        for flow, lane in band.lanes():
            heads.append((band.flow_rank(flow), lane.rank(ordering, now), next(tie), flow, lane))
        heapq.heapify(heads)
        while heads:
            rank, order, _, flow, lane = heapq.heappop(heads)
            head = lane.head()
            if head is None or lane.count == 0:
                continue
            current = (band.flow_rank(flow), lane.rank(ordering, now))
            if current > (rank, order):  # its flow or lane changed since this entry was made: requeue it
                heapq.heappush(heads, (*current, next(tie), flow, lane))
                continue
            outcome = place(head)
            if outcome is Placement.BLOCKED:
                blocked.append(head)
                continue
            self._take(band, head, dispatched=outcome is Placement.PLACED)
            (placed if outcome is Placement.PLACED else refused).append(head)
            if lane.count:
                heapq.heappush(heads, (band.flow_rank(flow), lane.rank(ordering, now), next(tie), flow, lane))

    def expire(self, now: float) -> list[QueueItem[T]]:
        """Take out every request whose deadline has passed, oldest deadline first."""
        gone: list[QueueItem[T]] = []
        while self._deadlines and self._deadlines[0][0] <= now:
            _, _, item = heapq.heappop(self._deadlines)  # (taking one may rebuild the heap)
            if item.queued:
                self._take(self._bands[item.priority], item, dispatched=False)
                gone.append(item)
        return gone

    def overdue(self, now: float, max_wait_s: float, *, below: int | None = None) -> list[QueueItem[T]]:
        """Take out every request that has waited longer than `max_wait_s` (in bands under
        priority `below`, when given), oldest first within each lane. A lane's head is its oldest
        request (lanes keep arrival order; edf's deadlines are arrival plus one TTL), so each lane
        is read only as far as its first request still within the bound."""
        gone: list[QueueItem[T]] = []
        limit = now - max_wait_s
        for priority in list(self._order):
            if below is not None and priority >= below:
                continue
            band = self._bands[priority]
            for _, lane in list(band.lanes()):
                while lane.count:
                    head = lane.head()
                    if head is None or head.enqueued_at > limit:
                        break
                    self._take(band, head, dispatched=False)
                    gone.append(head)
        return gone

    def take_below(self, priority: int) -> list[QueueItem[T]]:
        """Take out every request of a band under `priority` (shedding), highest band first."""
        gone: list[QueueItem[T]] = []
        for band_priority in list(self._order):
            if band_priority >= priority:
                continue
            band = self._bands[band_priority]
            for _, lane in list(band.lanes()):
                for item in list(lane):
                    self._take(band, item, dispatched=False)
                    gone.append(item)
        return gone

    def oldest_from(self, priority: int, now: float) -> float | None:
        """How long the oldest request at `priority` or above has waited; None when none waits.
        O(lanes): each lane's head is its oldest."""
        oldest: float | None = None
        for p in self._order:
            if p < priority:
                break
            for _, lane in self._bands[p].lanes():
                head = lane.head()
                if head is not None and (oldest is None or head.enqueued_at < oldest):
                    oldest = head.enqueued_at
        return None if oldest is None else now - oldest

    def waiting_from(self, priority: int) -> int:
        """Requests waiting at `priority` or above: those a newcomer of that priority may not pass."""
        return sum(self._bands[p].count for p in self._order if p >= priority)

    def position(self, priority: int, fairness_id: str) -> int:
        """About how many requests a newcomer of this band and flow would be dispatched after.

        Every request of a higher band and of its own flow; of each other flow in its band, none
        when the fairness policy ranks that flow behind the newcomer's, else as many as its own
        flow will dispatch meanwhile (fair policies interleave flows); under global-strict, all of
        them. An estimate for the overload judge, not a promise."""
        ahead = 0
        for p in self._order:
            if p > priority:
                ahead += self._bands[p].count
        band = self._bands.get(priority)
        if band is None or not band.count:
            return ahead
        if band.fairness == "global-strict":
            return ahead + band.count
        flow = band.flows.get(fairness_id)
        own = flow.count if flow is not None else 0
        rank = band.flow_rank(flow) if flow is not None else band.newcomer_rank(fairness_id)
        for other in band.flows.values():
            if other is flow:
                ahead += own
            elif band.flow_rank(other) < rank:
                ahead += min(other.count, own + 1)
        return ahead

    def charge(self, priority: int, fairness_id: str, cost: float) -> None:
        """Count `cost` more tokens served to a flow (output tokens, as its request finished)."""
        band = self._bands.get(priority)
        if band is not None:
            band.charge(fairness_id, cost)

    def remove(self, payload: T) -> QueueItem[T] | None:
        """Take out `payload` (its client left); None when it is not queued."""
        item = self._items.get(id(payload))
        if item is None or not item.queued:
            return None
        self._take(self._bands[item.priority], item, dispatched=False)
        return item

    def drain(self) -> list[QueueItem[T]]:
        """Take out everything, highest band first (shutdown)."""
        gone: list[QueueItem[T]] = []
        for priority in list(self._order):
            band = self._bands[priority]
            for _, lane in list(band.lanes()):
                for item in list(lane):
                    self._take(band, item, dispatched=False)
                    gone.append(item)
        return gone

    def waiting_in(self, priority: int, fairness_id: str, lane: Hashable) -> bool:
        """Whether requests of this lane wait already (a newcomer queues behind them)."""
        band = self._bands.get(priority)
        if band is None:
            return False
        flow = band.flows.get(fairness_id)
        return flow is not None and lane in flow.lanes

    def _take(self, band: Band[T], item: QueueItem[T], *, dispatched: bool) -> None:
        band.remove(item, dispatched=dispatched)
        del self._items[id(item.payload)]
        self.count -= 1
        self.size -= item.size
        deadlines = self._deadlines
        if not self._items:
            deadlines.clear()
        elif len(deadlines) > 2 * self.count + 64:
            # Entries of requests that left go lazily; once they outnumber the waiting ones the
            # heap is rebuilt, so it holds what waits (not every request of the last TTL).
            self._deadlines = [entry for entry in deadlines if entry[2].queued]
            heapq.heapify(self._deadlines)

    # -- views ------------------------------------------------------------------------------

    @property
    def held(self) -> int:
        """Entries the deadline heap holds, waiting or gone (bounded by about twice what waits)."""
        return len(self._deadlines)

    def bands(self, now: float) -> list[BandView]:
        views = []
        for priority in self._order:
            band = self._bands[priority]
            oldest = min((item.enqueued_at for item in self.items(priority)), default=None)
            views.append(
                BandView(
                    priority=priority,
                    requests=band.count,
                    bytes=band.size,
                    flows=sum(1 for flow in band.flows.values() if flow.count),
                    oldest_wait_s=None if oldest is None else now - oldest,
                )
            )
        return views

    def lanes(self, now: float, limit: int = 50) -> list[LaneView]:
        """The `limit` lanes whose requests have waited longest in total, longest first."""
        views = []
        for priority in self._order:
            for flow, lane in self._bands[priority].lanes():
                oldest = min((item.enqueued_at for item in lane), default=None)
                if oldest is None:
                    continue
                views.append(
                    LaneView(
                        priority=priority,
                        fairness_id=flow.fairness_id,
                        lane=lane.key,
                        requests=lane.count,
                        oldest_wait_s=now - oldest,
                        total_wait_s=lane.count * now - lane.enqueued_sum,
                    )
                )
        views.sort(key=lambda view: view.total_wait_s, reverse=True)
        return views[:limit]

    def flows(self, limit: int = 50) -> list[FlowView]:
        """The `limit` flows with the most requests waiting, most first."""
        views = []
        for priority in self._order:
            band = self._bands[priority]
            for flow in band.flows.values():
                if flow.count:
                    views.append(
                        FlowView(
                            priority=priority,
                            fairness_id=flow.fairness_id,
                            requests=flow.count,
                            counter=flow.counter if band.fairness == "vtc" else float(flow.turn),
                            ahead=self.position(priority, flow.fairness_id),
                        )
                    )
        views.sort(key=lambda view: view.requests, reverse=True)
        return views[:limit]

    def items(self, priority: int | None = None) -> Iterator[QueueItem[T]]:
        """Every waiting item (of one band), in no particular order."""
        for item in self._items.values():
            if priority is None or item.priority == priority:
                yield item

    def _band(self, priority: int) -> Band[T]:
        band = self._bands.get(priority)
        if band is None:
            settings = self.settings.band(priority)
            band = self._bands[priority] = _new_band(priority, settings)
            self._order = sorted(self._bands, reverse=True)
        return band


def _new_band(priority: int, settings: BandSettings) -> Band[T]:
    return Band(
        priority=priority,
        fairness=settings.fairness,
        ordering=settings.ordering,
        max_requests=settings.max_requests,
        max_bytes=settings.max_bytes,
        weights=dict(settings.weights),
        default_weight=settings.default_weight,
    )


__all__ = [
    "BandView",
    "FlowController",
    "FlowView",
    "LaneView",
    "PassResult",
    "Placement",
    "Rejection",
    "ordering_key",
]
