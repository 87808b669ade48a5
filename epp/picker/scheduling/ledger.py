"""The routing ledger: the one place where routing a request, and its finishing, changes scheduler state.

A request sent to an endpoint is in flight there until it finishes; if it names an adapter, that
adapter becomes most recently used in the endpoint's modelled GPU slots and counts once more in
the adapter's popularity. Our own routing, a peer replica's batch and a peer's reset all change
that state the same way, through `routed` and `finished`: nothing else writes in-flight counts,
residency or popularity on a request's behalf.

Listeners hear of every change, a request dropped by the in-flight bounds included (the peer
exchange forwards our own requests to the other replicas; flow control learns that capacity
freed). `Flight.origin` tells our own requests ("") from a peer's (its id).
"""

from __future__ import annotations

from collections.abc import Callable

from epp.picker.scheduling.inflight import Flight, InflightTracker
from epp.picker.scheduling.popularity import AdapterPopularity
from epp.picker.scheduling.residency import ResidencyModel

BASE_MODEL = ""  # the adapter a flight names when it needs no LoRA slot

# Called after each change: (flight, finished, now). `finished` is False when the flight was routed.
LedgerListener = Callable[[Flight, bool, float], None]
# Called as a flight ends: (flight, seconds from its dispatch to its first response byte when the
# data plane said, else None, now). What learns the cost of each choice listens here.
OutcomeListener = Callable[[Flight, float | None, float], None]


class RoutingLedger:
    """In-flight requests, adapter residency and popularity, changed together per request."""

    def __init__(
        self, inflight: InflightTracker, residency: ResidencyModel, popularity: AdapterPopularity
    ) -> None:
        self.inflight = inflight
        self.residency = residency
        self.popularity = popularity
        self._listeners: list[LedgerListener] = []
        self._outcomes: list[OutcomeListener] = []
        inflight.on_drop = self._released

    def __len__(self) -> int:
        return len(self.inflight)

    def listen(self, listener: LedgerListener) -> None:
        self._listeners.append(listener)

    def listen_outcomes(self, listener: OutcomeListener) -> None:
        self._outcomes.append(listener)

    def routed(self, key: str, endpoint: str, adapter: str, now: float, *, origin: str = "") -> None:
        """`key` was sent to `endpoint` at `now`; `adapter` is BASE_MODEL when it needs no LoRA slot.

        A key routed again moves (a retry elsewhere): the old flight finishes first.
        """
        if self.inflight.get(key) is not None:
            self.finished(key, now)
        self.inflight.add(key, endpoint, adapter, now, origin=origin)
        if adapter != BASE_MODEL:
            self.residency.on_routed(endpoint, adapter, now)
            self.popularity.record(adapter, now)
        if self._listeners:
            flight = self.inflight.get(key)
            assert flight is not None
            for listener in self._listeners:
                listener(flight, False, now)

    def finished(self, key: str, now: float, *, ttft_s: float | None = None) -> Flight | None:
        """`key` finished at `now`, its first byte `ttft_s` after dispatch (None: unknown); returns
        its flight, or None when the ledger does not hold it."""
        flight = self.inflight.remove(key)
        if flight is not None:
            self._released(flight, now, ttft_s)
        return flight

    def own(self) -> list[Flight]:
        """This process's own requests in flight, oldest first (what a peer's reset carries)."""
        return [flight for flight in self.inflight if flight.origin == ""]

    def _released(self, flight: Flight, now: float, ttft_s: float | None = None) -> None:
        for outcome in self._outcomes:
            outcome(flight, ttft_s, now)
        self.residency.on_completed(flight.endpoint)
        for listener in self._listeners:
            listener(flight, True, now)
