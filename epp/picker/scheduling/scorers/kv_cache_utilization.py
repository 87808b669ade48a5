"""`kv-cache-utilization-scorer` (upstream): `1 − kv_cache_usage`; never scraped → 1 (upstream's zero KV)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from epp.picker.datastore.types import EndpointState
from epp.picker.scheduling.framework import ScheduleContext


@dataclass(frozen=True, slots=True)
class KvCacheUtilizationScorer:
    name: str = "kv-cache-utilization-scorer"

    def score(self, ctx: ScheduleContext, endpoints: Sequence[EndpointState]) -> list[float]:
        return [1.0 - min(1.0, max(0.0, e.metrics.kv_cache_usage)) if e.metrics else 1.0 for e in endpoints]
