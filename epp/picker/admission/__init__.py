"""Admission: pool saturation and criticality/priority-based shedding (pure, synchronous).

The saturation detector is read from the EndpointPickerConfig once, by `detector_config`:
admission sheds by it, and flow control gates dispatch by the same thresholds, so the two can
never disagree about when the pool is full.
"""

from __future__ import annotations

from dataclasses import dataclass

from epp.errors import ConfigError
from epp.picker.admission.saturation import SaturationDetector, SaturationLevel
from epp.picker.admission.shedding import SHED_MESSAGE, Admission
from epp.picker.scheduling.params import Params
from epp.picker.scheduling.picker_config import PickerConfig, PluginSpec, parse_config_duration
from epp.picker.scheduling.plugins import LORA_CAPACITY_DETECTOR, SATURATION_DETECTOR_TYPES

__all__ = [
    "SHED_MESSAGE",
    "Admission",
    "DetectorConfig",
    "SaturationDetector",
    "SaturationLevel",
    "build_admission",
    "detector_config",
]


@dataclass(frozen=True, slots=True)
class DetectorConfig:
    """The configured saturation detector: its type, thresholds and the knobs around them."""

    plugin_type: str | None  # None: the config names no detector, so upstream's defaults apply
    detector: SaturationDetector
    shed_standard: bool = True
    drain_after_s: float | None = None  # `drainAfter` of lora-capacity-detector; None: not set
    wait_target_s: float | None = None  # `queueWaitTarget` of lora-capacity-detector; None: not set
    reserve_share: float | None = None  # `fairShareReserve` of lora-capacity-detector; None: not set


def detector_config(config: PickerConfig | None, *, staleness_threshold_s: float = 2.0) -> DetectorConfig:
    """The detector plugin named by `saturationDetector.pluginRef`, else the only detector plugin.

    Types: `utilization-detector`, `saturation-detector` and ours, `lora-capacity-detector`
    (which also turns on flow control's per-endpoint slot gate). Parameters:
    `queueDepthThreshold` (5), `kvCacheUtilThreshold` (0.8), `overloadQueueDepthThreshold`
    (20), `overloadKvCacheUtilThreshold` (0.95), `metricsStalenessThreshold` (duration;
    default `staleness_threshold_s`), `shedStandard` (true), upstream's `headroom` (read past),
    and for `lora-capacity-detector` only, `drainAfter` and `queueWaitTarget` (durations; the
    latter is how long a request may wait in a saturated pool's queue, `0s`: until its TTL) and
    `fairShareReserve` (the share of batch slots an overloaded pool keeps for flows within their
    fair share, 0 to 0.5; `0`: none).
    Raises ConfigError.
    """
    spec = _detector_spec(config) if config is not None else None
    params = Params(spec.name if spec else "saturation-detector", spec.parameters if spec else None)
    staleness_s = staleness_threshold_s
    raw_staleness = params.raw_value("metricsStalenessThreshold")
    if raw_staleness is not None:
        staleness_s = parse_config_duration(raw_staleness, "metricsStalenessThreshold")
        if staleness_s <= 0:
            raise ConfigError(f"metricsStalenessThreshold: must be positive, got {raw_staleness!r}")
    queue = params.integer("queueDepthThreshold", 5, minimum=0)
    kv = params.number("kvCacheUtilThreshold", 0.8, minimum=0, maximum=1)
    overload_queue = params.integer("overloadQueueDepthThreshold", max(20, queue), minimum=0)
    overload_kv = params.number("overloadKvCacheUtilThreshold", max(0.95, kv), minimum=0, maximum=1)
    shed_standard = params.boolean("shedStandard", True)
    params.accept("headroom")
    drain_after_s: float | None = None
    wait_target_s: float | None = None
    reserve_share: float | None = None
    if spec is not None and spec.type == LORA_CAPACITY_DETECTOR:
        if params.raw_value("fairShareReserve") is not None:
            reserve_share = params.number("fairShareReserve", 0.0, minimum=0, maximum=0.5)
        raw_drain = params.raw_value("drainAfter")
        if raw_drain is not None:
            drain_after_s = parse_config_duration(raw_drain, f"plugin {spec.name!r}: parameter 'drainAfter'")
        raw_target = params.raw_value("queueWaitTarget")
        if raw_target is not None:
            wait_target_s = parse_config_duration(
                raw_target, f"plugin {spec.name!r}: parameter 'queueWaitTarget'"
            )
    params.done()
    try:
        detector = SaturationDetector(
            queue_depth_threshold=queue,
            kv_cache_util_threshold=kv,
            overload_queue_depth_threshold=overload_queue,
            overload_kv_cache_util_threshold=overload_kv,
            staleness_threshold_s=staleness_s,
        )
    except ValueError as err:
        raise ConfigError(f"saturation detector: {err}") from err
    return DetectorConfig(
        plugin_type=spec.type if spec else None,
        detector=detector,
        shed_standard=shed_standard,
        drain_after_s=drain_after_s,
        wait_target_s=wait_target_s,
        reserve_share=reserve_share,
    )


def build_admission(config: PickerConfig | None = None, *, staleness_threshold_s: float = 2.0) -> Admission:
    """Admission from the config's saturation detector (see `detector_config`), or defaults.

    `config` comes loaded, by whoever also builds the scheduler from it. Raises ConfigError.
    """
    chosen = detector_config(config, staleness_threshold_s=staleness_threshold_s)
    return Admission(detector=chosen.detector, shed_standard=chosen.shed_standard)


def _detector_spec(config: PickerConfig) -> PluginSpec | None:
    if config.saturation_detector_ref is not None:
        spec = config.plugin(config.saturation_detector_ref)
        if spec.type not in SATURATION_DETECTOR_TYPES:
            raise ConfigError(
                f"saturationDetector.pluginRef {spec.name!r} is a {spec.type!r}, not a saturation detector"
            )
        return spec
    found = [p for p in config.plugins if p.type in SATURATION_DETECTOR_TYPES]
    if len(found) > 1:
        raise ConfigError("several saturation detector plugins; name one in saturationDetector.pluginRef")
    return found[0] if found else None
