"""Admission: shed by criticality and priority when the pool is saturated.

Order is fixed: Sheddable (criticality Sheddable, or objective priority < 0) goes first,
at SATURATED; Standard only at OVERLOADED (when `shed_standard` is on), which needs fresh
metrics showing overload on every candidate; Critical (or an objective priority above 0) never.
A shed request gets 429 with a reason; nothing else changes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from epp.errors import EppError, ErrorCode
from epp.picker.admission.saturation import SaturationDetector, SaturationLevel
from epp.picker.datastore.types import Criticality, EndpointState, Snapshot
from epp.picker.scheduling.types import LLMRequest

SHED_MESSAGE = "system saturated, sheddable request dropped"


@dataclass(frozen=True, slots=True)
class Admission:
    detector: SaturationDetector = field(default_factory=SaturationDetector)
    shed_standard: bool = True

    def shed_level(self, request: LLMRequest) -> SaturationLevel | None:
        """The saturation level at which `request` is shed; None = never."""
        if request.criticality is Criticality.CRITICAL and request.priority >= 0:
            return None
        if request.objective is not None and request.priority > 0:
            return None  # an objective above the default priority is as protected as Critical
        if request.sheddable:
            return SaturationLevel.SATURATED
        return SaturationLevel.OVERLOADED if self.shed_standard else None

    def admit(
        self, request: LLMRequest, candidates: Sequence[EndpointState], snapshot: Snapshot, now: float
    ) -> None:
        """Return if admitted; raise EppError(RESOURCE_EXHAUSTED) with a reason if shed."""
        threshold = self.shed_level(request)
        if threshold is None:
            return
        level = self.detector.level(candidates, now)
        if level >= threshold:
            reason = "saturated" if threshold is SaturationLevel.SATURATED else "overloaded"
            raise EppError(ErrorCode.RESOURCE_EXHAUSTED, SHED_MESSAGE, reason=reason)
