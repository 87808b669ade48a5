"""How popular each adapter is right now: exponentially decayed request counts.

Drives the size of an adapter's home set (more homes for more popular adapters) and how
costly evicting an adapter is. Bounded: at most `max_adapters` are remembered (the
coldest are forgotten first).
"""

from __future__ import annotations

import math


class AdapterPopularity:
    """Decayed request count per adapter with half-life `half_life_s`; time is the caller's `now`."""

    def __init__(self, *, half_life_s: float = 60.0, max_adapters: int = 20_000) -> None:
        if half_life_s <= 0 or max_adapters <= 0:
            raise ValueError("half_life_s and max_adapters must be positive")
        self._decay_per_s = math.log(2.0) / half_life_s
        self._max_adapters = max_adapters
        self._counts: dict[str, tuple[float, float]] = {}  # adapter -> (count, at)
        self._total: tuple[float, float] = (0.0, 0.0)

    def __len__(self) -> int:
        return len(self._counts)

    def _decayed(self, value: tuple[float, float], now: float) -> float:
        count, at = value
        if now <= at:
            return count
        return count * math.exp(-self._decay_per_s * (now - at))

    def record(self, adapter: str, now: float) -> None:
        self._counts[adapter] = (self._decayed(self._counts.get(adapter, (0.0, now)), now) + 1.0, now)
        self._total = (self._decayed(self._total, now) + 1.0, now)
        if len(self._counts) > self._max_adapters + self._max_adapters // 4:
            self._prune(now)

    def rate(self, adapter: str, now: float) -> float:
        """Decayed request count of `adapter` (0 when never seen or forgotten)."""
        value = self._counts.get(adapter)
        return 0.0 if value is None else self._decayed(value, now)

    def share(self, adapter: str, now: float) -> float:
        """Fraction of recent traffic that went to `adapter`, in [0, 1]."""
        total = self._decayed(self._total, now)
        if total <= 0.0:
            return 0.0
        return min(1.0, self.rate(adapter, now) / total)

    def _prune(self, now: float) -> None:
        ranked = sorted(self._counts, key=lambda a: self._decayed(self._counts[a], now), reverse=True)
        self._counts = {a: self._counts[a] for a in ranked[: self._max_adapters]}
