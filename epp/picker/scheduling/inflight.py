"""Requests the EPP itself has routed and not yet seen complete, per endpoint.

Scraped queues lag by a scrape interval; without this count every request of a burst
between two scrapes would land on the same "empty" pod. Memory is bounded: entries older
than `request_timeout_s` are dropped (a lost completion never leaks), and at most
`max_tracked` requests are held (oldest dropped first).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Flight:
    """One request in flight."""

    key: str
    endpoint: str
    adapter: str  # "" for the base model (needs no LoRA slot)
    routed_at: float
    origin: str = ""  # "" for this process's own requests, else the peer replica that routed it


class InflightTracker:
    """Per-endpoint and per-(endpoint, adapter) in-flight counts, kept by the routing ledger.

    `on_drop` hears of every request let go by the bounds (its completion never came).
    """

    def __init__(
        self,
        *,
        request_timeout_s: float = 600.0,
        max_tracked: int = 200_000,
        on_drop: Callable[[Flight, float], None] | None = None,
    ) -> None:
        if request_timeout_s <= 0 or max_tracked <= 0:
            raise ValueError("request_timeout_s and max_tracked must be positive")
        self._request_timeout_s = request_timeout_s
        self._max_tracked = max_tracked
        # Insertion order is nearly routing order: a peer's flights arrive back-dated.
        self._by_request: dict[str, Flight] = {}
        self.on_drop = on_drop
        self._by_endpoint: dict[str, dict[str, float]] = {}
        self._adapters: dict[str, dict[str, int]] = {}
        self._adapter_totals: dict[str, int] = {}  # adapter -> in flight over every endpoint ("" excluded)
        self._versions: dict[str, int] = {}  # endpoint -> bumped on every add/remove there
        # endpoint -> (since_s, version, count): every decision asks each candidate for the count
        # since its last scrape, and between two scrapes only the pods routed to change.
        self._since: dict[str, tuple[float, int, int]] = {}
        # endpoint -> when requests were routed there, oldest first, for the last `recent_horizon_s`
        # (finished ones included): `routed_recently` counts from the newest end.
        self._recent: dict[str, deque[float]] = {}
        self.recent_horizon_s = 10.0

    def __len__(self) -> int:
        return len(self._by_request)

    def __iter__(self) -> Iterator[Flight]:
        """Every request in flight, oldest first."""
        return iter(list(self._by_request.values()))

    def add(self, request_id: str, endpoint: str, adapter: str, now: float, *, origin: str = "") -> None:
        """Count `request_id` as in flight on `endpoint` from `now` (a repeated id is moved)."""
        if request_id in self._by_request:
            self.remove(request_id)
        self._expire(now)
        self._by_request[request_id] = Flight(request_id, endpoint, adapter, now, origin)
        self._by_endpoint.setdefault(endpoint, {})[request_id] = now
        self._versions[endpoint] = self._versions.get(endpoint, 0) + 1
        per_adapter = self._adapters.setdefault(endpoint, {})
        per_adapter[adapter] = per_adapter.get(adapter, 0) + 1
        if adapter:
            self._adapter_totals[adapter] = self._adapter_totals.get(adapter, 0) + 1
        recent = self._recent.get(endpoint)
        if recent is None:
            recent = self._recent[endpoint] = deque()
        recent.append(now)
        horizon = now - self.recent_horizon_s
        while recent[0] < horizon:
            recent.popleft()

    def get(self, request_id: str) -> Flight | None:
        return self._by_request.get(request_id)

    def remove(self, request_id: str) -> Flight | None:
        """Forget `request_id`; returns what was in flight, or None if unknown."""
        entry = self._by_request.pop(request_id, None)
        if entry is None:
            return None
        self._versions[entry.endpoint] = self._versions.get(entry.endpoint, 0) + 1
        requests = self._by_endpoint.get(entry.endpoint)
        if requests is not None:
            requests.pop(request_id, None)
            if not requests:
                del self._by_endpoint[entry.endpoint]
        if entry.adapter:
            total = self._adapter_totals.get(entry.adapter, 0) - 1
            if total > 0:
                self._adapter_totals[entry.adapter] = total
            else:
                self._adapter_totals.pop(entry.adapter, None)
        per_adapter = self._adapters.get(entry.endpoint)
        if per_adapter is not None:
            left = per_adapter.get(entry.adapter, 0) - 1
            if left > 0:
                per_adapter[entry.adapter] = left
            else:
                per_adapter.pop(entry.adapter, None)
                if not per_adapter:
                    del self._adapters[entry.endpoint]
        return entry

    def count(self, endpoint: str) -> int:
        requests = self._by_endpoint.get(endpoint)
        return len(requests) if requests else 0

    def routed_since(self, endpoint: str, since_s: float) -> int:
        """In-flight requests routed to `endpoint` strictly after `since_s` (e.g. the last scrape)."""
        requests = self._by_endpoint.get(endpoint)
        if not requests:
            return 0
        version = self._versions.get(endpoint, 0)
        cached = self._since.get(endpoint)
        if cached is not None and cached[0] == since_s and cached[1] == version:
            return cached[2]
        # Every entry: a peer's flight arrives back-dated (routed before its batch was sent), so
        # routing order is not insertion order. Cached until the endpoint changes.
        n = sum(1 for routed_at in requests.values() if routed_at > since_s)
        self._since[endpoint] = (since_s, version, n)
        return n

    def routed_from(self, endpoint: str, since_s: float) -> int:
        """In-flight requests routed to `endpoint` at `since_s` or later: what a scrape taken at
        `since_s` cannot show yet (requests routed in the same instant went after it)."""
        requests = self._by_endpoint.get(endpoint)
        if not requests:
            return 0
        return sum(1 for routed_at in requests.values() if routed_at >= since_s)

    def routed_recently(self, endpoint: str, since_s: float) -> int:
        """Requests routed to `endpoint` at `since_s` or later, finished or not (within the last
        `recent_horizon_s`): O(the count). A peer's back-dated flight is counted where it arrived."""
        recent = self._recent.get(endpoint)
        if not recent:
            return 0
        n = 0
        for routed_at in reversed(recent):
            if routed_at < since_s:
                break
            n += 1
        return n

    def version(self, endpoint: str) -> int:
        """Changes whenever a request is added to or removed from `endpoint` (for caches)."""
        return self._versions.get(endpoint, 0)

    def forget(self, keep: set[str]) -> None:
        """Drop the version counters of endpoints not in `keep` that hold nothing in flight."""
        for endpoint in [e for e in self._versions if e not in keep and e not in self._by_endpoint]:
            del self._versions[endpoint]
            self._since.pop(endpoint, None)
            self._recent.pop(endpoint, None)

    @property
    def adapters_in_flight(self) -> int:
        """Distinct adapters with a request in flight anywhere (the base model not counted)."""
        return len(self._adapter_totals)

    def adapter_count(self, endpoint: str, adapter: str) -> int:
        per_adapter = self._adapters.get(endpoint)
        return per_adapter.get(adapter, 0) if per_adapter else 0

    def adapters(self, endpoint: str) -> dict[str, int] | None:
        """Adapter → requests in flight on `endpoint` (the base model as ""); None when idle.

        The caller must not change it."""
        return self._adapters.get(endpoint)

    def expire(self, now: float) -> None:
        """Let go of what the bounds drop now (also done at each `add`; callers that route nothing
        for a while, such as a queue waiting on slots stale entries hold, call it themselves)."""
        self._expire(now)

    def _expire(self, now: float) -> None:
        oldest_allowed = now - self._request_timeout_s
        while self._by_request:
            request_id, entry = next(iter(self._by_request.items()))
            if entry.routed_at >= oldest_allowed and len(self._by_request) < self._max_tracked:
                break
            self.remove(request_id)
            if self.on_drop is not None:
                self.on_drop(entry, now)
