"""Flow control: requests wait in the EPP, by priority band and flow, until an endpoint can start them.

`controller` holds the queues and runs dispatch passes, `queues` the bands, flows and lanes with
their fairness and ordering policies, `capacity` the gates that say which endpoints can start a
request now (upstream's pool saturation, or ours: request headroom and LoRA slots per endpoint),
`overload` the judge that refuses early what a saturated pool cannot serve in time, `fairshare`
the flows over their share that may not take the last free batch slots then, `settings` the
knobs. All of it is pure: the director drives it, in `epp serve` and `epp bench`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from epp.picker.admission.saturation import SaturationDetector
from epp.picker.flowcontrol.capacity import Gate, SaturationGate, SlotGate
from epp.picker.flowcontrol.controller import FlowController
from epp.picker.flowcontrol.fairshare import FairShares
from epp.picker.flowcontrol.overload import OverloadJudge
from epp.picker.flowcontrol.settings import Capacity, FlowControlSettings
from epp.picker.scheduling.state import SchedulerState

if TYPE_CHECKING:
    from epp.picker.lifecycle import RequestLife


@dataclass(frozen=True, slots=True)
class FlowControl:
    """The queues and the gate that says when a queued request can start."""

    queues: FlowController[RequestLife]
    gate: Gate
    judge: OverloadJudge | None = None  # None: requests wait until dispatched or their TTL
    shares: FairShares | None = None  # None: no batch slots kept for flows within their share


def build_flow_control(
    settings: FlowControlSettings, state: SchedulerState, detector: SaturationDetector
) -> FlowControl | None:
    """Flow control as `settings` ask, over the scheduler's state; None when it is off."""
    if not settings.enabled:
        return None
    gate: Gate
    if settings.capacity is Capacity.LORA_SLOTS:
        gate = SlotGate(state, detector, drain_after_s=settings.drain_after_s)
    else:
        gate = SaturationGate(detector)
    judge = OverloadJudge(settings.overload) if settings.overload.enabled else None
    shares = FairShares(settings.fair_share) if judge is not None and settings.fair_share.enabled else None
    return FlowControl(FlowController(settings), gate, judge, shares)


__all__ = ["Capacity", "FlowControl", "FlowControlSettings", "build_flow_control"]
