"""Fair shares while the pool is overloaded: which flows ask for more than theirs.

Fairness in the queue (vtc) decides who goes first among requests that wait; it cannot help a
tenant within its share whose request arrives to find every batch slot taken by a tenant that
floods: it waits for the next request anywhere to finish, and on slow pods that is long. So while
the pool is overloaded, a few batch slots stay free for the flows within their share (trunk
reservation, as telephone exchanges keep circuits for priority calls): a request from a flow that
asks for more than its share starts only while more than `reserve` slots are free.

A flow's share is its max-min fair share of what the pool dispatches (water-filling): bands are
served highest first, each gets what the bands above leave; within a band, flows that ask for less
than an equal split get all they ask, and the rest is split evenly among the others. A flow asks
for its arrivals per second over the last `window_s` (refused ones included: demand, not
service). A flow is held back only where another flow of its band is within its share: between
bands strict priority decides.

Pure and synchronous, like the rest of flow control: the director records arrivals and asks.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

DEFAULT_WINDOW_S = 5.0  # arrival rates are measured over this much recent time
# The pool's capacity is what it dispatched a second over this much recent time: longer than the
# arrival window, since a saturated pool's dispatches come in bursts as requests finish.
CAPACITY_WINDOW_S = 10.0
# The slots kept free, as a share of the pool's batch slots (at least 1). `epp bench`, seed 1:
# see docs/benchmarks.md, "Overload".
DEFAULT_RESERVE_SHARE = 0.05
# Shares are worked out again at most this often (a pass per arrival would redo it per request).
RECOMPUTE_S = 0.1


@dataclass(frozen=True, slots=True)
class FairShareSettings:
    """`reserve_share` 0 turns the reservation off."""

    window_s: float = DEFAULT_WINDOW_S
    reserve_share: float = DEFAULT_RESERVE_SHARE

    def __post_init__(self) -> None:
        if not self.window_s > 0:
            raise ValueError("the fair-share window must be positive")
        if not 0 <= self.reserve_share < 1:
            raise ValueError("the reserved share of batch slots must be in [0, 1)")

    @property
    def enabled(self) -> bool:
        return self.reserve_share > 0

    def reserve(self, batch_slots: int) -> int:
        """Slots kept free in a pool of `batch_slots`."""
        return max(1, math.ceil(self.reserve_share * batch_slots))


class FairShares:
    """Arrival rates per (band, flow), and which flows ask for more than their share."""

    def __init__(self, settings: FairShareSettings) -> None:
        self.settings = settings
        self._arrivals: dict[tuple[int, str], deque[float]] = {}
        self._dispatches: deque[float] = deque()
        self._over: frozenset[tuple[int, str]] = frozenset()
        self._computed_at = -math.inf
        self._forgot_at = -math.inf

    def arrived(self, priority: int, fairness_id: str, now: float) -> None:
        times = self._arrivals.get((priority, fairness_id))
        if times is None:
            times = self._arrivals[(priority, fairness_id)] = deque()
        times.append(now)
        if now - self._forgot_at >= self.settings.window_s:
            self._forget(now)  # memory follows the windows, however many flows come and go

    def dispatched(self, now: float) -> None:
        self._dispatches.append(now)
        if now - self._forgot_at >= self.settings.window_s:
            self._forget(now)

    @property
    def held(self) -> int:
        """The arrival and dispatch times kept: bounded by the windows, not by time or flows."""
        return len(self._dispatches) + sum(len(times) for times in self._arrivals.values())

    def capacity(self, now: float) -> float:
        """Requests the pool dispatched a second lately (what it can take while it is saturated)."""
        start = now - CAPACITY_WINDOW_S
        return sum(1 for at in self._dispatches if at >= start) / CAPACITY_WINDOW_S

    def over_share(self, priority: int, fairness_id: str, now: float) -> bool:
        """Whether the flow asks for more than its fair share of what the pool dispatches."""
        if now - self._computed_at >= RECOMPUTE_S:
            self._forget(now)  # what is left is in the windows: counting it is enough
            window = self.settings.window_s
            rates = {key: len(times) / window for key, times in self._arrivals.items()}
            self._over = over_their_share(rates, len(self._dispatches) / CAPACITY_WINDOW_S)
            self._computed_at = now
        return (priority, fairness_id) in self._over

    def rates(self, now: float) -> dict[tuple[int, str], float]:
        """Arrivals per second per (band, flow) over the window, read without forgetting anything."""
        start = now - self.settings.window_s
        return {
            key: sum(1 for at in times if at >= start) / self.settings.window_s
            for key, times in self._arrivals.items()
            if times and times[-1] >= start
        }

    def view(self, now: float) -> dict[str, object]:
        """What `/debug/flow-control` shows, worked out without changing anything."""
        rates, capacity = self.rates(now), self.capacity(now)
        over = over_their_share(rates, capacity)
        return {
            "reserve_share": self.settings.reserve_share,
            "dispatch_rate_per_s": round(capacity, 3),
            "over_share": [
                {"priority": priority, "fairness_id": fid, "arrivals_per_s": round(rates[(priority, fid)], 3)}
                for priority, fid in sorted(over)
            ],
        }

    def _forget(self, now: float) -> None:
        """Drop arrivals and dispatches older than their windows, and flows with none left."""
        self._forgot_at = now
        start = now - self.settings.window_s
        for key in list(self._arrivals):
            times = self._arrivals[key]
            while times and times[0] < start:
                times.popleft()
            if not times:
                del self._arrivals[key]
        dispatches, start = self._dispatches, now - CAPACITY_WINDOW_S
        while dispatches and dispatches[0] < start:
            dispatches.popleft()


def over_their_share(rates: dict[tuple[int, str], float], capacity: float) -> frozenset[tuple[int, str]]:
    """The (band, flow)s asking more than their max-min fair share of `capacity` (see the module
    docstring): bands highest first, water-filling within each."""
    bands: dict[int, list[tuple[float, str]]] = {}
    for (priority, fairness_id), rate in rates.items():
        bands.setdefault(priority, []).append((rate, fairness_id))
    over: set[tuple[int, str]] = set()
    left = capacity
    for priority in sorted(bands, reverse=True):
        demands = sorted(bands[priority])
        total = sum(rate for rate, _ in demands)
        if total <= left:
            left -= total
            continue
        # Water-filling: the smallest demands are met in full while they are under an even split.
        # Only where some flow of the band is within its share: that is who the reserve is for
        # (between bands, strict priority already decides who starts next).
        flows = len(demands)
        for i, (rate, _) in enumerate(demands):
            share = left / (flows - i)
            if rate <= share:
                left -= rate
                continue
            if i > 0:
                over.update((priority, fid) for _, fid in demands[i:])
            break
        left = 0.0
    return frozenset(over)
