"""Flow control's settings from an EndpointPickerConfig, as upstream's `flowControl` section means them.

The loader (`epp.picker.scheduling.picker_config`) checks the section's shape whether or not the gate is
on; this module gives it meaning: the gate, upstream's defaults, the policies each band runs and
the capacity gate the detector plugin picks.

On or off: the `flowControl` feature gate (`flowControl` or `flowControl=true` in `featureGates`).
With it off the section is not applied (the loader marks it ignored, so start-up warns), as
upstream falls back to its legacy admission then; only its detector ref still counts.

Applied, with upstream's meaning and defaults:

- `maxBytes`, `maxRequests`: Kubernetes quantities across every band; unset or 0: unlimited.
- `defaultRequestTTL`: how long a request may wait; unset: 60 s; `0s`: until its client leaves.
- `priorityBands[]`: `priority` (required, unique), `maxBytes` (unset or 0: 1 GB), `maxRequests`
  (unset or 0: 5000), `fairnessPolicyRef`, `orderingPolicyRef` (plugin instance names; unset:
  `global-strict-fairness-policy`, `fcfs-ordering-policy`, which resolve without being listed).
- `defaultPriorityBand`: the same keys, the template for a priority no band names.
- `defaultNegativePriorityBand`: the template for priorities below 0 (unset: `defaultPriorityBand`).
- `saturationDetector.pluginRef`: the same as the top-level key (naming both differently is an
  error). The capacity gate follows the detector's type: `lora-capacity-detector` (ours) gates per
  endpoint on request headroom and LoRA slots, with its `drainAfter` for the starvation guard;
  any other detector gates on whole-pool saturation, as upstream.
- Ours, with `lora-capacity-detector` only: its `queueWaitTarget` (default 500 ms; `0s`: off), the
  overload judge's target (`flowcontrol.overload`): while the pool is saturated, Sheddable requests
  are refused at once and others once they cannot be dispatched within it (429, `Retry-After`);
  and its `fairShareReserve` (default 0.05; `0`: off), the share of batch slots an overloaded
  pool keeps for flows within their fair share (`flowcontrol.fairshare`).
- `enableEviction: false` and `noEndpointRequestTTL: 0s` say what this EPP does anyway.

Refused with the reason, never dropped silently, because each would change behaviour the user
relies on: `enableEviction: true` (started requests are never cut off), a non-zero
`noEndpointRequestTTL` (with no endpoints a request is answered 503 at once),
`usageLimitPolicyPluginRef` (no usage-limit policies: a band dispatches until the gate closes, as
upstream's default static policy), `bandSelectionPolicyPluginRef` (bands go strictly by
priority), a band's own `defaultRequestTTL`, and the `slo-deadline-ordering-policy` type.
"""

from __future__ import annotations

from epp.errors import ConfigError
from epp.picker.admission import DetectorConfig, SaturationDetector, detector_config
from epp.picker.flowcontrol.fairshare import FairShareSettings
from epp.picker.flowcontrol.overload import DEFAULT_WAIT_TARGET_S, OverloadSettings
from epp.picker.flowcontrol.settings import (
    DEFAULT_BAND_MAX_BYTES,
    DEFAULT_BAND_MAX_REQUESTS,
    DEFAULT_DRAIN_AFTER_S,
    DEFAULT_REQUEST_TTL_S,
    BandSettings,
    Capacity,
    FlowControlSettings,
)
from epp.picker.scheduling.picker_config import PickerConfig, PriorityBandSpec
from epp.picker.scheduling.plugins import LORA_CAPACITY_DETECTOR

__all__ = ["flow_control_detector", "flow_control_settings"]


def flow_control_settings(
    config: PickerConfig | None, *, detector: DetectorConfig | None = None
) -> FlowControlSettings:
    """The settings `config` asks for; `FlowControlSettings()` (off) when the gate is off or no config.

    `detector` is the config's detector as `epp.picker.admission.detector_config` read it, when
    the caller has it already; otherwise it is read here. The section is turned into settings even
    with the gate off, so a config that would fail on the day the gate is flipped fails today.
    Raises ConfigError.
    """
    if config is None:
        return FlowControlSettings()
    chosen = detector if detector is not None else detector_config(config)
    spec = config.flow_control
    default_band = _band(spec.default_band, "flowControl.defaultPriorityBand")
    negative_band = None
    if spec.default_negative_band is not None:
        negative_band = _band(spec.default_negative_band, "flowControl.defaultNegativePriorityBand")
    slots = chosen.plugin_type == LORA_CAPACITY_DETECTOR
    try:
        settings = FlowControlSettings(
            enabled=True,
            capacity=Capacity.LORA_SLOTS if slots else Capacity.SATURATION,
            request_ttl_s=DEFAULT_REQUEST_TTL_S if spec.request_ttl_s is None else spec.request_ttl_s,
            max_requests=spec.max_requests,
            max_bytes=spec.max_bytes,
            default_band=default_band,
            default_negative_band=negative_band,
            bands={
                priority: _band(band, f"flowControl.priorityBands[{i}]")
                for i, (priority, band) in enumerate(spec.bands)
            },
            drain_after_s=DEFAULT_DRAIN_AFTER_S if chosen.drain_after_s is None else chosen.drain_after_s,
            overload=OverloadSettings(
                wait_target_s=(
                    0.0
                    if not slots
                    else DEFAULT_WAIT_TARGET_S
                    if chosen.wait_target_s is None
                    else chosen.wait_target_s
                )
            ),
            fair_share=FairShareSettings()
            if chosen.reserve_share is None
            else FairShareSettings(reserve_share=chosen.reserve_share),
        )
    except ValueError as err:  # the loader checked every value; this guards hand-built configs
        raise ConfigError(f"flowControl: {err}") from err
    return settings if config.flow_control_enabled else FlowControlSettings()


def flow_control_detector(
    config: PickerConfig | None, *, staleness_threshold_s: float = 2.0
) -> SaturationDetector:
    """The detector flow control gates by: the one admission sheds by, so both agree on "full".

    Where the caller builds admission too, `build_admission(config).detector` is the same value
    and need not be read twice. Raises ConfigError.
    """
    return detector_config(config, staleness_threshold_s=staleness_threshold_s).detector


def _band(spec: PriorityBandSpec, where: str) -> BandSettings:
    """Upstream's band defaults: a per-band limit always applies (0 means the default, not none)."""
    try:
        return BandSettings(
            fairness=spec.fairness.policy,
            ordering=spec.ordering.policy,
            max_requests=spec.max_requests or DEFAULT_BAND_MAX_REQUESTS,
            max_bytes=spec.max_bytes or DEFAULT_BAND_MAX_BYTES,
            weights=spec.fairness.weights,
            default_weight=spec.fairness.default_weight,
        )
    except ValueError as err:
        raise ConfigError(f"{where}: {err}") from err
