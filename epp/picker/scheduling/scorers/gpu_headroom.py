"""`gpu-headroom-scorer`: prefer pods with free KV cache: `1 − kv_cache_usage`.

Unknown (never scraped) pods score 0.5. Requests deferred for a LoRA slot take a
further share away: each deferred request costs `deferredPenalty` of the score.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from epp.picker.datastore.types import EndpointState
from epp.picker.scheduling.framework import ScheduleContext


@dataclass(frozen=True, slots=True)
class GpuHeadroomScorer:
    name: str = "gpu-headroom-scorer"
    deferred_penalty: float = 0.1

    def score(self, ctx: ScheduleContext, endpoints: Sequence[EndpointState]) -> list[float]:
        penalty = self.deferred_penalty
        out: list[float] = []
        append = out.append
        for e in endpoints:
            m = e.metrics
            if m is None:
                append(0.5)
                continue
            headroom = 1.0 - m.kv_cache_usage - penalty * m.deferred_requests
            append(headroom if 0.0 <= headroom <= 1.0 else (1.0 if headroom > 1.0 else 0.0))
        return out
