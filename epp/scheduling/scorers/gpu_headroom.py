"""`gpu-headroom-scorer`: prefer pods with free KV cache: `1 − kv_cache_usage`.

Unknown (never scraped) pods score 0.5. Requests deferred for a LoRA slot take a
further share away: each deferred request costs `deferredPenalty` of the score.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from epp.datastore.types import EndpointState
from epp.scheduling.framework import ScheduleContext


@dataclass(frozen=True, slots=True)
class GpuHeadroomScorer:
    name: str = "gpu-headroom-scorer"
    deferred_penalty: float = 0.1

    def score(self, ctx: ScheduleContext, endpoints: Sequence[EndpointState]) -> list[float]:
        out: list[float] = []
        for e in endpoints:
            m = e.metrics
            if m is None:
                out.append(0.5)
                continue
            headroom = 1.0 - m.kv_cache_usage
            if m.deferred_requests:
                headroom -= self.deferred_penalty * m.deferred_requests
            out.append(min(1.0, max(0.0, headroom)))
        return out
