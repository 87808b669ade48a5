"""Flow control's settings: one value per knob, each with its one default.

`FlowControlSettings` is what `epp serve` and `epp bench` run with; `epp.picker.flowcontrol.config_section`
builds it from an EndpointPickerConfig's `flowControl` section (upstream's keys) and flags.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field

from epp.picker.flowcontrol.fairshare import FairShareSettings
from epp.picker.flowcontrol.overload import OverloadSettings
from epp.picker.flowcontrol.queues import FAIRNESS_POLICIES, ORDERING_POLICIES

DEFAULT_BAND_MAX_BYTES = 1_000_000_000  # 1 GB of request bodies per band, as upstream
DEFAULT_BAND_MAX_REQUESTS = 5_000  # requests per band, as upstream
DEFAULT_REQUEST_TTL_S = 60.0  # the longest a request waits in a queue before it is answered 503
DEFAULT_DRAIN_AFTER_S = 1.0  # an adapter waiting this long for a slot gets one freed for it
# How often a queue is looked at again without being asked (scrapes may have freed capacity, TTLs
# run out); a finished request or a peer's batch looks at once. `epp serve` and `epp bench` alike:
# measured on zipf-100, 20 ms gives P99 TTFT 1.33 s where 10 ms gives 1.18 s.
PUMP_INTERVAL_S = 0.01
NO_EARLY_REFUSAL = OverloadSettings(wait_target_s=0.0)  # requests wait until dispatched or their TTL
DEFAULT_FAIR_SHARE = FairShareSettings()


class Capacity(enum.Enum):
    """What decides that an endpoint can start a request now."""

    # Upstream's gate: the pool is saturated when no endpoint has fresh metrics under the
    # queue-depth and KV thresholds; while it is, nothing is dispatched.
    SATURATION = "saturation"
    # Ours: per endpoint, request headroom (the same thresholds) and a LoRA slot: the request's
    # adapter is in flight there, or fewer adapters than `max_lora` are. Late binding: a request
    # waits here until some endpoint can start it, then goes to the best of those.
    LORA_SLOTS = "lora-slots"


@dataclass(frozen=True, slots=True)
class BandSettings:
    """One priority band's policies and limits (0: unlimited)."""

    fairness: str = "global-strict"
    ordering: str = "fcfs"
    max_requests: int = DEFAULT_BAND_MAX_REQUESTS
    max_bytes: int = DEFAULT_BAND_MAX_BYTES
    weights: tuple[tuple[str, float], ...] = ()  # vtc: (fairness ID, weight)
    default_weight: float = 1.0  # vtc: the weight of a flow `weights` does not name

    def __post_init__(self) -> None:
        if self.fairness not in FAIRNESS_POLICIES:
            raise ValueError(
                f"unknown fairness policy {self.fairness!r} (known: {', '.join(FAIRNESS_POLICIES)})"
            )
        if self.ordering not in ORDERING_POLICIES:
            raise ValueError(
                f"unknown ordering policy {self.ordering!r} (known: {', '.join(ORDERING_POLICIES)})"
            )
        if self.max_requests < 0 or self.max_bytes < 0:
            raise ValueError("band limits must not be negative")
        weights = [self.default_weight, *(weight for _, weight in self.weights)]
        if not all(math.isfinite(weight) and weight > 0 for weight in weights):
            raise ValueError("fairness weights must be positive numbers")


@dataclass(frozen=True, slots=True)
class FlowControlSettings:
    """Whether requests queue in the EPP, and how."""

    enabled: bool = False
    capacity: Capacity = Capacity.LORA_SLOTS
    request_ttl_s: float = DEFAULT_REQUEST_TTL_S  # 0: no TTL (a request waits until its client leaves)
    max_requests: int = 0  # across every band; 0: unlimited
    max_bytes: int = 0  # across every band; 0: unlimited
    default_band: BandSettings = BandSettings()  # for priorities `bands` does not name
    default_negative_band: BandSettings | None = None  # the same below 0; None: `default_band`
    bands: dict[int, BandSettings] = field(default_factory=dict)
    drain_after_s: float = DEFAULT_DRAIN_AFTER_S
    # Early refusal while the pool is saturated (`overload`); off unless the gate is ours.
    overload: OverloadSettings = NO_EARLY_REFUSAL
    # Batch slots kept for flows within their fair share while the pool is overloaded; only with
    # the overload judge on (it says when the pool is overloaded).
    fair_share: FairShareSettings = DEFAULT_FAIR_SHARE

    def __post_init__(self) -> None:
        if not self.request_ttl_s >= 0:  # NaN fails too
            raise ValueError("the request TTL must not be negative")
        if self.max_requests < 0 or self.max_bytes < 0:
            raise ValueError("flow control limits must not be negative")
        if not self.drain_after_s >= 0:
            raise ValueError("drain_after_s must not be negative")

    def band(self, priority: int) -> BandSettings:
        band = self.bands.get(priority)
        if band is not None:
            return band
        if priority < 0 and self.default_negative_band is not None:
            return self.default_negative_band
        return self.default_band
