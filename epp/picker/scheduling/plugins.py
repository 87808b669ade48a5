"""Plugin types by upstream (GIE / llm-d) type name → a factory of validated parameters.

A factory takes the plugin's name, its `Params` and the scheduler's shared state and
returns the plugin. `KINDS` says what each type is, so config loading can apply the
defaulting rules before anything is built.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass

from epp.picker.scheduling.filters import (
    DecodeFilter,
    HeaderBasedTestingFilter,
    LeastKvCacheFilter,
    LeastQueueFilter,
    LoraAffinityFilter,
    LowQueueFilter,
)
from epp.picker.scheduling.framework import Filter, Picker, Scorer
from epp.picker.scheduling.params import Params
from epp.picker.scheduling.pickers import MaxScorePicker, RandomPicker, WeightedRandomPicker
from epp.picker.scheduling.scorers.adapter_affinity import AdapterAffinityScorer
from epp.picker.scheduling.scorers.gpu_headroom import GpuHeadroomScorer
from epp.picker.scheduling.scorers.kv_cache_utilization import KvCacheUtilizationScorer
from epp.picker.scheduling.scorers.load import LoadScorer
from epp.picker.scheduling.scorers.lora_affinity import LoraAffinityScorer
from epp.picker.scheduling.scorers.prefix_cache import PrefixCacheScorer
from epp.picker.scheduling.scorers.queue import QueueScorer, RunningRequestsScorer
from epp.picker.scheduling.state import SchedulerState


class PluginKind(enum.Enum):
    FILTER = "filter"
    SCORER = "scorer"
    PICKER = "picker"
    PROFILE_HANDLER = "profile-handler"
    # Accepted so upstream configs load as-is; the work they name is done elsewhere
    # (metrics refreshers, admission) or built in (the prefix producer).
    OTHER = "other"


@dataclass(frozen=True, slots=True)
class OtherPlugin:
    """A plugin with no role in the scheduling profile (data sources, detectors, handlers)."""

    name: str
    type: str
    params: dict[str, float | int | bool | str | None]


Plugin = Filter | Scorer | Picker | OtherPlugin
Factory = Callable[[str, Params, SchedulerState], Plugin]


def _adapter_affinity(name: str, p: Params, state: SchedulerState) -> Plugin:
    defaults = AdapterAffinityScorer()
    return AdapterAffinityScorer(
        name=name,
        active=p.number("activeScore", defaults.active, minimum=0, maximum=1),
        resident=p.number("residentScore", defaults.resident, minimum=0, maximum=1),
        free_slot=p.number("freeSlotScore", defaults.free_slot, minimum=0, maximum=1),
        widen_slot=p.number("widenSlotScore", defaults.widen_slot, minimum=0, maximum=1),
        evict=p.number("evictScore", defaults.evict, minimum=0, maximum=1),
        saturated_home=p.number("saturatedHomeScore", defaults.saturated_home, minimum=0, maximum=1),
        draining_home=p.number("drainingHomeScore", defaults.draining_home, minimum=0, maximum=1),
        drain_after_s=p.number("drainAfterSeconds", defaults.drain_after_s, minimum=0),
        spill_queue_threshold=p.number("spillQueueThreshold", defaults.spill_queue_threshold, minimum=0),
        spill_load_ratio=p.number("spillLoadRatio", defaults.spill_load_ratio, minimum=0),
        home_spread=p.number("homeSpread", defaults.home_spread, minimum=0),
        protect_ratio=p.number("protectRatio", defaults.protect_ratio, minimum=0),
        planned_home=p.number("plannedHomeScore", defaults.planned_home, minimum=0, maximum=1),
        planned_swap=p.number("plannedSwapScore", defaults.planned_swap, minimum=0, maximum=1),
    )


def _prefix(name: str, p: Params, state: SchedulerState) -> Plugin:
    block_chars = p.optional_integer("hashBlockSize", minimum=1)
    block_tokens = p.optional_integer("blockSizeTokens", minimum=1)  # v1.5 name: tokens × 4 characters
    if block_chars is None:
        block_chars = block_tokens * 4 if block_tokens is not None else 64
    max_blocks = p.integer("maxPrefixBlocksToMatch", 256, minimum=1)
    max_tokens = p.optional_integer("maxPrefixTokensToMatch", minimum=1)
    if max_tokens is not None:
        max_blocks = max(1, max_tokens * 4 // block_chars)
    capacity = p.optional_integer("lruCapacityPerServer", minimum=1)
    p.accept("autoTune")
    return PrefixCacheScorer(
        name=name, block_size_chars=block_chars, max_blocks=max_blocks, lru_capacity_per_server=capacity
    )


def _load(name: str, p: Params, state: SchedulerState) -> Plugin:
    defaults = LoadScorer()
    return LoadScorer(
        name=name,
        queue_scale=p.number("queueScale", defaults.queue_scale, minimum=1e-9),
        running_weight=p.number("runningWeight", defaults.running_weight, minimum=0),
    )


def _headroom(name: str, p: Params, state: SchedulerState) -> Plugin:
    return GpuHeadroomScorer(
        name=name, deferred_penalty=p.number("deferredPenalty", 0.1, minimum=0, maximum=1)
    )


def _max_score(name: str, p: Params, state: SchedulerState) -> Plugin:
    return MaxScorePicker(name=name, max_endpoints=p.integer("maxNumOfEndpoints", 1, minimum=1))


def _random(name: str, p: Params, state: SchedulerState) -> Plugin:
    return RandomPicker(name=name, max_endpoints=p.integer("maxNumOfEndpoints", 1, minimum=1))


def _weighted_random(name: str, p: Params, state: SchedulerState) -> Plugin:
    return WeightedRandomPicker(name=name, max_endpoints=p.integer("maxNumOfEndpoints", 1, minimum=1))


def _low_queue(name: str, p: Params, state: SchedulerState) -> Plugin:
    return LowQueueFilter(name=name, threshold=p.integer("threshold", 128, minimum=0))


def _lora_filter(name: str, p: Params, state: SchedulerState) -> Plugin:
    return LoraAffinityFilter(name=name, threshold=p.number("threshold", 0.999, minimum=0, maximum=1))


def _simple(cls: Callable[..., Plugin]) -> Factory:
    def factory(name: str, p: Params, state: SchedulerState) -> Plugin:
        return cls(name=name)

    return factory


def _other(type_name: str) -> Factory:
    def factory(name: str, p: Params, state: SchedulerState) -> Plugin:
        raw = p.raw_items()
        return OtherPlugin(name=name, type=type_name, params=raw)

    return factory


PLUGINS: dict[str, Factory] = {
    # upstream scorers
    "lora-affinity-scorer": _simple(LoraAffinityScorer),
    "queue-scorer": _simple(QueueScorer),
    "kv-cache-utilization-scorer": _simple(KvCacheUtilizationScorer),
    "kv-cache-scorer": _simple(KvCacheUtilizationScorer),  # v0.5 name
    "prefix-cache-scorer": _prefix,
    "running-requests-size-scorer": _simple(RunningRequestsScorer),
    # ours
    "adapter-affinity-scorer": _adapter_affinity,
    "kv-cache-match-scorer": _prefix,
    "load-scorer": _load,
    "gpu-headroom-scorer": _headroom,
    # pickers
    "max-score-picker": _max_score,
    "random-picker": _random,
    "weighted-random-picker": _weighted_random,
    # filters
    "low-queue-filter": _low_queue,
    "least-queue-filter": _simple(LeastQueueFilter),
    "least-kv-cache-filter": _simple(LeastKvCacheFilter),
    "lora-affinity-filter": _lora_filter,
    "header-based-testing-filter": _simple(HeaderBasedTestingFilter),
    "decode-filter": _simple(DecodeFilter),
    # profile handler and accepted non-profile plugins
    "single-profile-handler": _other("single-profile-handler"),
    "approx-prefix-cache-producer": _other("approx-prefix-cache-producer"),
    "metrics-data-source": _other("metrics-data-source"),
    "core-metrics-extractor": _other("core-metrics-extractor"),
    "utilization-detector": _other("utilization-detector"),
    "saturation-detector": _other("saturation-detector"),
}

KINDS: dict[str, PluginKind] = {
    **{t: PluginKind.SCORER for t in PLUGINS if t.endswith("-scorer")},
    **{t: PluginKind.PICKER for t in PLUGINS if t.endswith("-picker")},
    **{t: PluginKind.FILTER for t in PLUGINS if t.endswith("-filter")},
    "single-profile-handler": PluginKind.PROFILE_HANDLER,
    "approx-prefix-cache-producer": PluginKind.OTHER,
    "metrics-data-source": PluginKind.OTHER,
    "core-metrics-extractor": PluginKind.OTHER,
    "utilization-detector": PluginKind.OTHER,
    "saturation-detector": PluginKind.OTHER,
}

SATURATION_DETECTOR_TYPES = frozenset({"utilization-detector", "saturation-detector"})
