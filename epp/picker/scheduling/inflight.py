"""Requests the EPP itself has routed and not yet seen complete, per endpoint.

Scraped queues lag by a scrape interval; without this count every request of a burst
between two scrapes would land on the same "empty" pod. Memory is bounded: entries older
than `request_timeout_s` are dropped (a lost completion never leaks), and at most
`max_tracked` requests are held (oldest dropped first).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class _Entry:
    endpoint: str
    adapter: str
    routed_at: float


class InflightTracker:
    """Per-endpoint and per-(endpoint, adapter) in-flight counts, fed by on_routed/on_completed."""

    def __init__(self, *, request_timeout_s: float = 600.0, max_tracked: int = 200_000) -> None:
        if request_timeout_s <= 0 or max_tracked <= 0:
            raise ValueError("request_timeout_s and max_tracked must be positive")
        self._request_timeout_s = request_timeout_s
        self._max_tracked = max_tracked
        # Insertion order is routing order (callers pass a non-decreasing `now`).
        self._by_request: dict[str, _Entry] = {}
        self._by_endpoint: dict[str, dict[str, float]] = {}
        self._adapters: dict[str, dict[str, int]] = {}
        self._versions: dict[str, int] = {}  # endpoint -> bumped on every add/remove there
        # endpoint -> (since_s, version, count): every decision asks each candidate for the count
        # since its last scrape, and between two scrapes only the pods routed to change.
        self._since: dict[str, tuple[float, int, int]] = {}

    def __len__(self) -> int:
        return len(self._by_request)

    def add(self, request_id: str, endpoint: str, adapter: str, now: float) -> None:
        """Count `request_id` as in flight on `endpoint` from `now` (a repeated id is moved)."""
        if request_id in self._by_request:
            self.remove(request_id)
        self._expire(now)
        self._by_request[request_id] = _Entry(endpoint, adapter, now)
        self._by_endpoint.setdefault(endpoint, {})[request_id] = now
        self._versions[endpoint] = self._versions.get(endpoint, 0) + 1
        per_adapter = self._adapters.setdefault(endpoint, {})
        per_adapter[adapter] = per_adapter.get(adapter, 0) + 1

    def remove(self, request_id: str) -> str | None:
        """Forget `request_id`; returns the endpoint it was counted on, or None if unknown."""
        entry = self._by_request.pop(request_id, None)
        if entry is None:
            return None
        self._versions[entry.endpoint] = self._versions.get(entry.endpoint, 0) + 1
        requests = self._by_endpoint.get(entry.endpoint)
        if requests is not None:
            requests.pop(request_id, None)
            if not requests:
                del self._by_endpoint[entry.endpoint]
        per_adapter = self._adapters.get(entry.endpoint)
        if per_adapter is not None:
            left = per_adapter.get(entry.adapter, 0) - 1
            if left > 0:
                per_adapter[entry.adapter] = left
            else:
                per_adapter.pop(entry.adapter, None)
                if not per_adapter:
                    del self._adapters[entry.endpoint]
        return entry.endpoint

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
        n = 0
        for routed_at in reversed(requests.values()):
            if routed_at <= since_s:
                break
            n += 1
        self._since[endpoint] = (since_s, version, n)
        return n

    def version(self, endpoint: str) -> int:
        """Changes whenever a request is added to or removed from `endpoint` (for caches)."""
        return self._versions.get(endpoint, 0)

    def forget(self, keep: set[str]) -> None:
        """Drop the version counters of endpoints not in `keep` that hold nothing in flight."""
        for endpoint in [e for e in self._versions if e not in keep and e not in self._by_endpoint]:
            del self._versions[endpoint]
            self._since.pop(endpoint, None)

    def adapter_count(self, endpoint: str, adapter: str) -> int:
        per_adapter = self._adapters.get(endpoint)
        return per_adapter.get(adapter, 0) if per_adapter else 0

    def _expire(self, now: float) -> None:
        oldest_allowed = now - self._request_timeout_s
        while self._by_request:
            request_id, entry = next(iter(self._by_request.items()))
            if entry.routed_at >= oldest_allowed and len(self._by_request) < self._max_tracked:
                break
            self.remove(request_id)
