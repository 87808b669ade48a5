"""Admission: pool saturation and criticality/priority-based shedding (pure, synchronous)."""

from __future__ import annotations

from epp.durations import parse_duration
from epp.errors import ConfigError
from epp.picker.admission.saturation import SaturationDetector, SaturationLevel
from epp.picker.admission.shedding import SHED_MESSAGE, Admission
from epp.picker.scheduling.config import PickerConfig, PluginSpec, load_config
from epp.picker.scheduling.params import Params
from epp.picker.scheduling.plugins import SATURATION_DETECTOR_TYPES

__all__ = ["SHED_MESSAGE", "Admission", "SaturationDetector", "SaturationLevel", "build_admission"]


def build_admission(config_text: str | None = None, *, staleness_threshold_s: float = 2.0) -> Admission:
    """Admission from the EndpointPickerConfig's saturation detector plugin, or defaults.

    The detector is the plugin named by `saturationDetector.pluginRef`, else the only
    plugin of type `utilization-detector` / `saturation-detector`. Its parameters:
    `queueDepthThreshold` (5), `kvCacheUtilThreshold` (0.8), `overloadQueueDepthThreshold`
    (20), `overloadKvCacheUtilThreshold` (0.95), `metricsStalenessThreshold` (duration;
    default `staleness_threshold_s`), `shedStandard` (true). Raises ConfigError.
    """
    spec = _detector_spec(load_config(config_text)) if config_text is not None else None
    params = Params(spec.name if spec else "saturation-detector", spec.parameters if spec else None)
    staleness_s = staleness_threshold_s
    raw_staleness = params.raw_value("metricsStalenessThreshold")
    if raw_staleness is not None:
        staleness_s = _duration(raw_staleness)
    queue = params.integer("queueDepthThreshold", 5, minimum=0)
    kv = params.number("kvCacheUtilThreshold", 0.8, minimum=0, maximum=1)
    overload_queue = params.integer("overloadQueueDepthThreshold", max(20, queue), minimum=0)
    overload_kv = params.number("overloadKvCacheUtilThreshold", max(0.95, kv), minimum=0, maximum=1)
    shed_standard = params.boolean("shedStandard", True)
    params.accept("headroom")
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
    return Admission(detector=detector, shed_standard=shed_standard)


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


def _duration(value: object) -> float:
    if isinstance(value, bool):
        raise ConfigError(f"metricsStalenessThreshold: expected a duration, got {value!r}")
    try:
        seconds = float(value) if isinstance(value, int | float) else parse_duration(str(value))
    except ValueError as err:  # a DurationError says what is wrong
        raise ConfigError(f"metricsStalenessThreshold: {err}") from err
    if seconds <= 0:
        raise ConfigError(f"metricsStalenessThreshold: must be positive, got {value!r}")
    return seconds
