"""Pool saturation from one snapshot's candidates, in levels.

Upstream v1: the pool is saturated when **no** candidate has fresh metrics with waiting
queue ≤ 5 and KV usage ≤ 0.8 (zero candidates = saturated). We add a higher "overload"
level with its own (looser) thresholds, at which Standard traffic is shed too.

Missing or stale metrics are not evidence of overload: before the first scrape, or with a
wrong metrics port, the pool is at most SATURATED (only Sheddable traffic is shed, as
upstream). OVERLOADED needs every candidate to report fresh metrics above the overload
thresholds.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass

from epp.picker.datastore.types import EndpointState


class SaturationLevel(enum.IntEnum):
    OK = 0
    SATURATED = 1  # shed Sheddable (criticality Sheddable or priority < 0)
    OVERLOADED = 2  # shed Standard as well; Critical is never shed by admission


@dataclass(frozen=True, slots=True)
class SaturationDetector:
    queue_depth_threshold: int = 5
    kv_cache_util_threshold: float = 0.8
    overload_queue_depth_threshold: int = 20
    overload_kv_cache_util_threshold: float = 0.95
    staleness_threshold_s: float = 2.0

    def __post_init__(self) -> None:
        if self.queue_depth_threshold < 0 or self.overload_queue_depth_threshold < self.queue_depth_threshold:
            raise ValueError("need 0 ≤ queue_depth_threshold ≤ overload_queue_depth_threshold")
        if not 0 <= self.kv_cache_util_threshold <= self.overload_kv_cache_util_threshold <= 1:
            raise ValueError("need 0 ≤ kv_cache_util_threshold ≤ overload_kv_cache_util_threshold ≤ 1")
        if self.staleness_threshold_s <= 0:
            raise ValueError("staleness_threshold_s must be positive")

    def level(self, candidates: Sequence[EndpointState], now: float) -> SaturationLevel:
        """OK if some fresh pod is under the saturation thresholds; OVERLOADED only if every pod
        is fresh and over the overload thresholds; else SATURATED (also for no pods, or when
        some pod's metrics are missing or stale)."""
        if not candidates:
            return SaturationLevel.SATURATED
        level = SaturationLevel.OVERLOADED
        for c in candidates:
            m = c.metrics
            if m is None or not c.is_fresh(now, self.staleness_threshold_s):
                level = SaturationLevel.SATURATED  # unknown is not evidence of overload
                continue
            if (
                m.waiting_requests <= self.queue_depth_threshold
                and m.kv_cache_usage <= self.kv_cache_util_threshold
            ):
                return SaturationLevel.OK
            if (
                m.waiting_requests <= self.overload_queue_depth_threshold
                and m.kv_cache_usage <= self.overload_kv_cache_util_threshold
            ):
                level = SaturationLevel.SATURATED
        return level
