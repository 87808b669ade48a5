"""`lora-affinity-scorer` as upstream v1.x defines it, for the `gie-v1`-style baselines.

Target in the running set → 1.0; else `len(running) + len(waiting) < max_lora` → 0.8;
else target in the waiting set → 0.6; else 0. Kept faithful, including its known flaws
with real vLLM (running = waiting, so the capacity test double-counts; base-model
requests score as if they needed a slot). Our `adapter-affinity-scorer` fixes these.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from epp.picker.datastore.types import EndpointState
from epp.picker.scheduling.framework import ScheduleContext


@dataclass(frozen=True, slots=True)
class LoraAffinityScorer:
    name: str = "lora-affinity-scorer"

    def score(self, ctx: ScheduleContext, endpoints: Sequence[EndpointState]) -> list[float]:
        target = ctx.request.target_model
        out: list[float] = []
        for e in endpoints:
            m = e.metrics
            if m is None:
                out.append(0.0)
            elif target in m.running_adapters:
                out.append(1.0)
            elif len(m.running_adapters) + len(m.waiting_adapters) < m.max_lora:
                out.append(0.8)
            elif target in m.waiting_adapters:
                out.append(0.6)
            else:
                out.append(0.0)
        return out
