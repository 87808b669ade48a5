"""Plugin types by upstream (GIE / llm-d) type name → a factory of validated parameters.

A factory takes the plugin's name, its `Params` and the scheduler's shared state and
returns the plugin. `KINDS` says what each type is, so config loading can apply the
defaulting rules before anything is built.

Flow control's fairness and ordering policies are plugins too, as upstream: a `flowControl`
band names one by instance name. They have kinds of their own so that a profile refuses them
and a band refuses a plugin of the wrong kind. `policy_plugin` reads one; the loader calls it
when it resolves a band's refs, so a band holds the policy it runs, not a name to look up later.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from epp.errors import ConfigError
from epp.picker.scheduling.cost_learning import learned_costs
from epp.picker.scheduling.costs import CostPriors
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
from epp.picker.scheduling.scorers.predicted_ttft import PredictedTtftScorer
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
    # Flow control: which flow of a band goes next, and which request of a flow.
    FAIRNESS_POLICY = "fairness-policy"
    ORDERING_POLICY = "ordering-policy"


@dataclass(frozen=True, slots=True)
class OtherPlugin:
    """A plugin with no role in the scheduling profile (data sources, detectors, handlers)."""

    name: str
    type: str
    params: dict[str, float | int | bool | str | None]


@dataclass(frozen=True, slots=True)
class PolicyPlugin:
    """A flow-control fairness or ordering policy instance, as a band runs it."""

    name: str
    type: str
    policy: str  # what flow control's queues call it ("global-strict", "vtc", "fcfs", ...)
    weights: tuple[tuple[str, float], ...] = ()  # vtc: (fairness ID, weight)
    default_weight: float = 1.0  # vtc: the weight of a fairness ID `weights` does not name

    @property
    def kind(self) -> PluginKind:
        return KINDS[self.type]


Plugin = Filter | Scorer | Picker | OtherPlugin | PolicyPlugin
Factory = Callable[[str, Params, SchedulerState], Plugin]


def _adapter_affinity(name: str, p: Params, state: SchedulerState) -> Plugin:
    defaults = AdapterAffinityScorer()
    price = p.boolean("priceMisses", False)
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
        state=state,
        costs=learned_costs(state, _cost_priors(p)) if price else None,
        pricing_slot_share=p.number("pricingSlotShare", defaults.pricing_slot_share, minimum=0)
        if price
        else defaults.pricing_slot_share,
    )


def _cost_priors(p: Params) -> CostPriors:
    """Where a scheduler's learned costs start (read by every plugin that prices choices)."""
    d = CostPriors()
    return CostPriors(
        hit_s=p.number("hitSeconds", d.hit_s, minimum=0),
        per_load_s=p.number("perRequestSeconds", d.per_load_s, minimum=0),
        host_load_s=p.number("hostLoadSeconds", d.host_load_s, minimum=0),
        storage_load_s=p.number("storageLoadSeconds", d.storage_load_s, minimum=0),
        weight=p.number("priorWeight", d.weight, minimum=1e-9),
        alpha=p.number("alpha", d.alpha, minimum=1e-6, maximum=0.999),
    )


def _predicted_ttft(name: str, p: Params, state: SchedulerState) -> Plugin:
    estimator = learned_costs(state, _cost_priors(p))
    return PredictedTtftScorer(
        state, estimator, name=name, slot_wait_factor=p.number("slotWaitFactor", 1.0, minimum=0)
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
    prefill_weight = p.number("prefillWeight", defaults.prefill_weight, minimum=0)
    return LoadScorer(
        name=name,
        queue_scale=p.number("queueScale", defaults.queue_scale, minimum=1e-9),
        running_weight=p.number("runningWeight", defaults.running_weight, minimum=0),
        prefill_weight=prefill_weight,
        state=state,
        costs=learned_costs(state, _cost_priors(p)) if prefill_weight > 0 else None,
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


# Upstream policy type → flow control's name for it. `total-wait` is ours.
FAIRNESS_POLICY_TYPES: Mapping[str, str] = {
    "global-strict-fairness-policy": "global-strict",
    "round-robin-fairness-policy": "round-robin",
    "vtc-fairness-policy": "vtc",
}
ORDERING_POLICY_TYPES: Mapping[str, str] = {
    "fcfs-ordering-policy": "fcfs",
    "edf-ordering-policy": "edf",
    "total-wait-ordering-policy": "total-wait",
}
# The saturation detector whose choice turns on our capacity gate (request headroom and LoRA
# slots per endpoint) instead of upstream's whole-pool saturation.
LORA_CAPACITY_DETECTOR = "lora-capacity-detector"
# Upstream types we know and refuse. Loading one must fail with the reason: an unknown-type
# error would suggest a typo, and running something else in its place would mislead.
UNSUPPORTED_TYPES: Mapping[str, str] = {
    "slo-deadline-ordering-policy": (
        "this EPP reads no per-request TTFT objective; edf-ordering-policy orders by arrival + TTL"
    ),
}


def policy_plugin(name: str, type_name: str, p: Params) -> PolicyPlugin:
    """The policy `type_name` with its parameters read from `p` (the caller calls `p.done()`).

    Only vtc has parameters: `weights` (fairness ID → a positive number) and `defaultWeight`
    (positive, 1.0). Weights divide a flow's served bytes, so a flow of weight 2 gets twice
    the bytes of a flow of weight 1 while both are backlogged.
    """
    policy = FAIRNESS_POLICY_TYPES.get(type_name) or ORDERING_POLICY_TYPES.get(type_name)
    if policy is None:
        raise ConfigError(f"plugin {name!r}: {type_name!r} is not a flow-control policy")
    if policy != "vtc":
        return PolicyPlugin(name=name, type=type_name, policy=policy)
    default_weight = p.number("defaultWeight", 1.0)
    if not (default_weight > 0 and math.isfinite(default_weight)):
        raise ConfigError(
            f"plugin {name!r}: parameter 'defaultWeight' must be a positive number, got {default_weight!r}"
        )
    return PolicyPlugin(
        name=name,
        type=type_name,
        policy=policy,
        weights=_weights(name, p.raw_value("weights")),
        default_weight=default_weight,
    )


def _weights(name: str, raw: Any) -> tuple[tuple[str, float], ...]:
    if raw is None:
        return ()
    if not isinstance(raw, Mapping):
        raise ConfigError(
            f"plugin {name!r}: parameter 'weights' must map fairness IDs to positive numbers, got {raw!r}"
        )
    weights: list[tuple[str, float]] = []
    for flow, weight in raw.items():
        if not isinstance(flow, str) or not flow:
            raise ConfigError(
                f"plugin {name!r}: parameter 'weights': a fairness ID must be a non-empty string"
                f" (quote it), got {flow!r}"
            )
        if (
            isinstance(weight, bool)
            or not isinstance(weight, int | float)
            or not (weight > 0 and math.isfinite(weight))
        ):
            raise ConfigError(
                f"plugin {name!r}: parameter 'weights': the weight of {flow!r} must be a positive number,"
                f" got {weight!r}"
            )
        weights.append((flow, float(weight)))
    return tuple(weights)


def _policy(type_name: str) -> Factory:
    def factory(name: str, p: Params, state: SchedulerState) -> Plugin:
        return policy_plugin(name, type_name, p)

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
    "predicted-ttft-scorer": _predicted_ttft,
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
    LORA_CAPACITY_DETECTOR: _other(LORA_CAPACITY_DETECTOR),
    # flow control's policies
    **{t: _policy(t) for t in (*FAIRNESS_POLICY_TYPES, *ORDERING_POLICY_TYPES)},
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
    LORA_CAPACITY_DETECTOR: PluginKind.OTHER,
    **{t: PluginKind.FAIRNESS_POLICY for t in FAIRNESS_POLICY_TYPES},
    **{t: PluginKind.ORDERING_POLICY for t in ORDERING_POLICY_TYPES},
}

SATURATION_DETECTOR_TYPES = frozenset({"utilization-detector", "saturation-detector", LORA_CAPACITY_DETECTOR})

# What a band runs when its config names no policy. Upstream creates these two instances under
# their type names when `plugins:` does not list them, so a ref to either always resolves.
DEFAULT_FAIRNESS_POLICY = PolicyPlugin(
    "global-strict-fairness-policy", "global-strict-fairness-policy", "global-strict"
)
DEFAULT_ORDERING_POLICY = PolicyPlugin("fcfs-ordering-policy", "fcfs-ordering-policy", "fcfs")
