"""Named policies: ours (`default`) and the baselines we compare against, all one interface.

- `default`: adapter-affinity 0.50 + kv-cache-match 0.20 + load 0.15 + gpu-headroom 0.15,
  max-score picker; flow control on, gated per endpoint on request headroom and LoRA slots
  (`lora-capacity-detector`), so a request waits in the EPP rather than on a pod without a slot
  for its adapter, and a freed slot goes to the adapter whose waiting requests it relieves most.
- `learned-costs`: `default` with its load term replaced by each pod's predicted TTFT for the
  request (`predicted-ttft-scorer` 0.30: learned hit TTFT, per-request queueing delay and the price
  of a host-memory or storage adapter load there, `scheduling.costs`) and adapter affinity at 0.35.
- `gie-v1`: upstream v1.x default: queue 2, kv-cache-utilization 2, prefix 3, max-score picker.
- `gie-v0.3`: upstream v0.3.0 criticality decision tree (thresholds: KV 0.8, queue 5 for
  non-critical, 128 for critical, LoRA affinity 0.999), uniform random among survivors.
- `least-queue`: fewest waiting requests (scrape + what we routed since), random tie-break.
- `round-robin`, `random`: metric-blind, as a plain Kubernetes Service would be.
"""

from __future__ import annotations

from collections.abc import Sequence

from epp.errors import EppError, ErrorCode
from epp.picker.datastore.types import Criticality, EndpointState, Snapshot
from epp.picker.scheduling.filters import (
    LeastKvCacheFilter,
    LeastQueueFilter,
    LoraAffinityFilter,
    LowQueueFilter,
    apply_or_keep,
)
from epp.picker.scheduling.framework import ScheduleContext, prefer_fresh
from epp.picker.scheduling.state import SchedulerState
from epp.picker.scheduling.types import LLMRequest, Scheduler, SchedulingResult

POLICY_NAMES: tuple[str, ...] = (
    "default",
    "learned-costs",
    "round-robin",
    "random",
    "least-queue",
    "gie-v0.3",
    "gie-v1",
)

# One endpoint by default, as upstream: an ORIGINAL_DST cluster answers 503 to a comma list.
# Fallbacks are a config away (`maxNumOfEndpoints: 3`), for data planes that walk the list.
DEFAULT_CONFIG = """\
apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
featureGates: [flowControl]
plugins:
- type: adapter-affinity-scorer
- type: kv-cache-match-scorer
- type: load-scorer
- type: gpu-headroom-scorer
- type: max-score-picker
  parameters: {maxNumOfEndpoints: 1}
- type: lora-capacity-detector
- type: total-wait-ordering-policy
- type: vtc-fairness-policy
saturationDetector: {pluginRef: lora-capacity-detector}
flowControl:
  defaultPriorityBand: {fairnessPolicyRef: vtc-fairness-policy, orderingPolicyRef: total-wait-ordering-policy}
schedulingProfiles:
- name: default
  plugins:
  - {pluginRef: adapter-affinity-scorer, weight: 0.50}
  - {pluginRef: kv-cache-match-scorer, weight: 0.20}
  - {pluginRef: load-scorer, weight: 0.15}
  - {pluginRef: gpu-headroom-scorer, weight: 0.15}
  - {pluginRef: max-score-picker}
"""

# `default` with its load term replaced by each pod's learned predicted TTFT for the request
# (`predicted-ttft-scorer`, `scheduling.costs`: queueing and the price of a miss there), weighed
# beside a lighter adapter affinity, which keeps its placement plan, hotspot spill and drain guard.
LEARNED_COSTS_CONFIG = (
    DEFAULT_CONFIG.replace("- type: load-scorer\n", "- type: predicted-ttft-scorer\n")
    .replace(
        "{pluginRef: adapter-affinity-scorer, weight: 0.50}",
        "{pluginRef: adapter-affinity-scorer, weight: 0.35}",
    )
    .replace("{pluginRef: load-scorer, weight: 0.15}", "{pluginRef: predicted-ttft-scorer, weight: 0.30}")
)

GIE_V1_CONFIG = """\
apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: queue-scorer
- type: kv-cache-utilization-scorer
- type: prefix-cache-scorer
- type: max-score-picker
schedulingProfiles:
- name: default
  plugins:
  - {pluginRef: queue-scorer, weight: 2}
  - {pluginRef: kv-cache-utilization-scorer, weight: 2}
  - {pluginRef: prefix-cache-scorer, weight: 3}
  - {pluginRef: max-score-picker}
"""

_CONFIGS = {"default": DEFAULT_CONFIG, "learned-costs": LEARNED_COSTS_CONFIG, "gie-v1": GIE_V1_CONFIG}


def policy_config_text(name: str) -> str | None:
    """EndpointPickerConfig YAML of a config-defined policy (`default`, `gie-v1`); None for the
    hand-written baselines."""
    return _CONFIGS.get(name)


def policy_scheduler(name: str, state: SchedulerState) -> Scheduler | None:
    """The hand-written baselines; None for policies defined by a config."""
    if name == "round-robin":
        return RoundRobinScheduler(state)
    if name == "random":
        return RandomScheduler(state)
    if name == "least-queue":
        return LeastQueueScheduler(state)
    if name == "gie-v0.3":
        return GieV03Scheduler(state)
    return None


class _Baseline:
    """What every baseline shares: its state (least-queue reads the in-flight counts)."""

    name = "baseline"

    def __init__(self, state: SchedulerState) -> None:
        self.state = state

    def _result(self, endpoint: EndpointState, reason: str) -> SchedulingResult:
        return SchedulingResult(endpoints=(endpoint,), profile=self.name, reason=reason)

    def on_routed(self, request: LLMRequest, result: SchedulingResult, now: float) -> None:
        pass  # no plugin learns from picks; the ledger counts the request in flight


def _require(candidates: Sequence[EndpointState]) -> None:
    if not candidates:
        raise EppError(ErrorCode.SERVICE_UNAVAILABLE, "no candidate endpoints", reason="no-endpoints")


class RoundRobinScheduler(_Baseline):
    name = "round-robin"

    def __init__(self, state: SchedulerState) -> None:
        super().__init__(state)
        self._next = 0

    def schedule(
        self, request: LLMRequest, candidates: Sequence[EndpointState], snapshot: Snapshot, now: float
    ) -> SchedulingResult:
        _require(candidates)
        endpoint = candidates[self._next % len(candidates)]
        self._next = (self._next + 1) % 1_000_000_007
        return self._result(endpoint, "round-robin")


class RandomScheduler(_Baseline):
    name = "random"

    def schedule(
        self, request: LLMRequest, candidates: Sequence[EndpointState], snapshot: Snapshot, now: float
    ) -> SchedulingResult:
        _require(candidates)
        return self._result(candidates[self.state.rng.randrange(len(candidates))], "random")


class LeastQueueScheduler(_Baseline):
    name = "least-queue"

    def schedule(
        self, request: LLMRequest, candidates: Sequence[EndpointState], snapshot: Snapshot, now: float
    ) -> SchedulingResult:
        _require(candidates)
        usable = prefer_fresh(candidates, now, self.state.staleness_threshold_s)
        inflight = self.state.inflight
        queues = [
            (e.metrics.waiting_requests + inflight.routed_since(e.name, e.metrics.updated_at))
            if e.metrics
            else inflight.count(e.name)
            for e in usable
        ]
        best = min(queues)
        ties = [e for e, q in zip(usable, queues, strict=True) if q == best]
        return self._result(ties[self.state.rng.randrange(len(ties))], "least-queue")


class GieV03Scheduler(_Baseline):
    """Upstream v0.3.0's decision tree; a failing filter hands its input to the failure branch."""

    name = "gie-v0.3"
    kv_cache_threshold = 0.8
    queue_threshold_critical = 5
    queueing_threshold_lora = 128

    def __init__(self, state: SchedulerState) -> None:
        super().__init__(state)
        self._low_queue_critical = LowQueueFilter(threshold=self.queueing_threshold_lora, strict=True)
        self._least_queue = LeastQueueFilter()
        self._least_kv = LeastKvCacheFilter()
        self._lora = LoraAffinityFilter(threshold=0.999, count_waiting_separately=False)

    def schedule(
        self, request: LLMRequest, candidates: Sequence[EndpointState], snapshot: Snapshot, now: float
    ) -> SchedulingResult:
        _require(candidates)
        ctx = ScheduleContext(request=request, snapshot=snapshot, now=now, state=self.state)
        pods = prefer_fresh(candidates, now, self.state.staleness_threshold_s)
        if request.criticality is Criticality.CRITICAL:
            kept, ok = apply_or_keep(ctx, self._low_queue_critical, pods)
            chain = (
                (self._lora, self._least_queue, self._least_kv)
                if ok
                else (self._least_queue, self._lora, self._least_kv)
            )
            survivors = self._chain(ctx, chain, kept)
        else:
            kept = [
                e
                for e in pods
                if e.metrics is not None
                and e.metrics.waiting_requests <= self.queue_threshold_critical
                and e.metrics.kv_cache_usage <= self.kv_cache_threshold
            ]
            if not kept:
                raise EppError(
                    ErrorCode.RESOURCE_EXHAUSTED,
                    "dropping request due to limited backend resources",
                    reason="gie-v0.3-saturated",
                )
            survivors = self._chain(ctx, (self._least_queue, self._lora, self._least_kv), kept)
        return self._result(survivors[self.state.rng.randrange(len(survivors))], "gie-v0.3")

    @staticmethod
    def _chain(
        ctx: ScheduleContext,
        chain: Sequence[LeastQueueFilter | LeastKvCacheFilter | LoraAffinityFilter],
        pods: list[EndpointState],
    ) -> list[EndpointState]:
        for flt in chain:
            pods, _ = apply_or_keep(ctx, flt, pods)
        return pods
