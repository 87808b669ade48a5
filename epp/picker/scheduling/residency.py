"""Which adapters each pod holds in its GPU LoRA slots, modelled from what the EPP routed.

vLLM's `lora_requests_info` lists only adapters with a scheduled request: an idle adapter
still sitting in a GPU slot is invisible, and so is a request waiting for a slot. So we
keep our own model per pod: GPU slots (`max_lora` from the scrape, or a default) in LRU
order, behind them a CPU tier (`--max-cpu-loras`, not observable, so a configurable
default). Routing a request makes its adapter most-recently-used on that pod; a full pod
evicts its least-recently-used adapter that has nothing in flight. Each scrape adds the
adapters it shows as active. A gap between scrapes (the pod may have restarted) lowers
our confidence in the idle entries; a long gap clears them.

Memory: per pod at most `slots` GPU entries (plus transient over-commit while every slot
is busy) and `cpu_slots` CPU entries; pods not seen for a while are dropped by `forget`.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from epp.picker.datastore.types import EndpointState
from epp.picker.scheduling.inflight import InflightTracker


@dataclass(frozen=True, slots=True)
class ResidencyParams:
    """The model's own tuning, fixed in `epp serve` (no flag or config key sets it; tests vary it)."""

    default_max_lora: int = 4  # GPU slots assumed until a scrape reports max_lora
    default_max_cpu_lora: int = 0  # CPU-tier size; 0 = same as the GPU slot count (vLLM's default)
    confidence_gap_s: float = 10.0  # a scrape gap longer than this halves confidence in idle entries
    reset_gap_s: float = 60.0  # a scrape gap longer than this clears the pod (assume a restart)

    def __post_init__(self) -> None:
        if self.default_max_lora < 1:
            raise ValueError("default_max_lora must be at least 1")
        if self.default_max_cpu_lora < 0:
            raise ValueError("default_max_cpu_lora must not be negative")
        if not 0 < self.confidence_gap_s <= self.reset_gap_s:
            raise ValueError("need 0 < confidence_gap_s <= reset_gap_s")


@dataclass(slots=True)
class PodResidency:
    """One pod's modelled LoRA state. `gpu` maps adapter → confidence in (0, 1], LRU first."""

    slots: int
    cpu_slots: int
    gpu: OrderedDict[str, float] = field(default_factory=OrderedDict)
    cpu: OrderedDict[str, None] = field(default_factory=OrderedDict)
    last_scrape_at: float | None = None
    observed_active: frozenset[str] = frozenset()
    # Adapters we sent while every slot was busy → when, oldest first: they wait for a slot.
    waiters: OrderedDict[str, float] = field(default_factory=OrderedDict)
    deferred_since: float | None = None  # scrape time since which it has reported deferred requests
    version: int = 0  # bumped on every change to `gpu` or `waiters` (for caches)
    # (version, in-flight version) -> (victim, lightest holder, its in-flight count)
    _cached: tuple[int, int, str | None, str | None, int] | None = None


class ResidencyModel:
    """Per-pod GPU/CPU LoRA residency plus a reverse index adapter → pods holding it in GPU."""

    def __init__(self, inflight: InflightTracker, params: ResidencyParams | None = None) -> None:
        self._inflight = inflight
        self.params = params or ResidencyParams()
        self._pods: dict[str, PodResidency] = {}
        self._homes: dict[str, set[str]] = {}
        self._sorted_homes: dict[str, tuple[str, ...]] = {}  # cache of sorted(_homes[a]), dropped on change
        self.slot_total = 0  # GPU slots over every modelled pod

    def __len__(self) -> int:
        return len(self._pods)

    @property
    def pods(self) -> Mapping[str, PodResidency]:
        """Endpoint name → modelled pod state (read-only view for scorers)."""
        return self._pods

    def pod(self, endpoint: str) -> PodResidency | None:
        return self._pods.get(endpoint)

    def homes(self, adapter: str) -> frozenset[str] | set[str]:
        """Pods modelled as holding `adapter` in a GPU slot (do not mutate)."""
        return self._homes.get(adapter, _NO_HOMES)

    def sorted_homes(self, adapter: str) -> tuple[str, ...]:
        """`homes(adapter)` in name order (set order varies with the hash seed), cached until it changes."""
        cached = self._sorted_homes.get(adapter)
        if cached is None:
            homes = self._homes.get(adapter)
            if not homes:
                return ()
            cached = self._sorted_homes[adapter] = tuple(sorted(homes))
        return cached

    def _pod_for(self, endpoint: str, slots: int | None = None) -> PodResidency:
        pod = self._pods.get(endpoint)
        if pod is None:
            gpu_slots = slots or self.params.default_max_lora
            pod = PodResidency(slots=gpu_slots, cpu_slots=self._cpu_slots(gpu_slots))
            self._pods[endpoint] = pod
            self.slot_total += gpu_slots
        return pod

    def _cpu_slots(self, gpu_slots: int) -> int:
        return max(gpu_slots, self.params.default_max_cpu_lora)

    def observe(self, state: EndpointState) -> None:
        """Fold in a scrape; a no-op when `state.metrics` was already seen."""
        metrics = state.metrics
        if metrics is None or state.scrape_failures:
            return
        pod = self._pods.get(state.name)
        if pod is not None and pod.last_scrape_at == metrics.updated_at:
            return
        slots = metrics.max_lora or (pod.slots if pod else self.params.default_max_lora)
        if pod is None:
            pod = self._pod_for(state.name, slots)
        elif pod.slots != slots:
            self.slot_total += slots - pod.slots
            pod.slots = slots
            pod.cpu_slots = self._cpu_slots(slots)
        if pod.last_scrape_at is not None:
            gap_s = metrics.updated_at - pod.last_scrape_at
            if gap_s > self.params.reset_gap_s:
                self._clear(state.name, pod)
            elif gap_s > self.params.confidence_gap_s:
                for adapter in pod.gpu:
                    pod.gpu[adapter] *= 0.5
        pod.last_scrape_at = metrics.updated_at
        pod.observed_active = metrics.active_adapters
        if metrics.deferred_requests <= 0:
            pod.deferred_since = None
        elif pod.deferred_since is None:
            pod.deferred_since = metrics.updated_at
        pod.version += 1
        # Sorted: set order changes with the interpreter's hash seed; keep runs reproducible.
        for adapter in sorted(metrics.active_adapters):
            self._touch(state.name, pod, adapter)
        self._trim(state.name, pod, keep=None)

    def on_routed(self, endpoint: str, adapter: str, now: float = 0.0) -> None:
        """`adapter` was just sent to `endpoint`: make it MRU there, evicting an idle LRU if full."""
        pod = self._pod_for(endpoint)
        was_resident = adapter in pod.gpu
        self._touch(endpoint, pod, adapter)
        self._trim(endpoint, pod, keep=adapter)
        if not was_resident and len(pod.gpu) > pod.slots:
            pod.waiters[adapter] = now
            pod.version += 1

    def on_completed(self, endpoint: str) -> None:
        """A request on `endpoint` finished: slots it held may be evicted again, so re-trim."""
        pod = self._pods.get(endpoint)
        if pod is not None and len(pod.gpu) > pod.slots:
            self._trim(endpoint, pod, keep=None)

    def victim(self, endpoint: str, pod: PodResidency) -> str | None:
        """The adapter a load on a full `pod` would evict: its LRU entry with nothing in flight."""
        return self._slot_facts(endpoint, pod)[0]

    def _slot_facts(self, endpoint: str, pod: PodResidency) -> tuple[str | None, str | None, int]:
        """(victim, lightest holder, its in-flight count), cached until the pod or its in-flight set
        changes: a decision asks this of every full candidate, and only the pods a request was
        routed to or completed on change, so this is O(1) amortised per pod and decision."""
        inflight_version = self._inflight.version(endpoint)
        cached = pod._cached
        if cached is not None and cached[0] == pod.version and cached[1] == inflight_version:
            return cached[2], cached[3], cached[4]
        victim: str | None = None
        lightest: str | None = None
        lightest_count = 0
        observed = pod.observed_active
        for adapter in pod.gpu:
            count = self._inflight.adapter_count(endpoint, adapter)
            if victim is None and count == 0 and adapter not in observed:
                victim = adapter
            if adapter not in pod.waiters and (lightest is None or count < lightest_count):
                lightest, lightest_count = adapter, count
        pod._cached = (pod.version, inflight_version, victim, lightest, lightest_count)
        return victim, lightest, lightest_count

    def drain_target(self, endpoint: str, pod: PodResidency, now: float, after_s: float) -> str | None:
        """On a pod where a request has waited for a slot `after_s` or longer, the adapter to stop
        feeding; else None.

        The slot-holding adapter with the fewest requests in flight (LRU first on ties):
        routing its new requests elsewhere lets it finish soonest and free its slot for the
        waiting adapter, while the pod's other adapters keep their traffic. A short wait is
        left alone: a slot often frees by itself, and draining moves traffic to other pods.
        """
        since = pod.deferred_since
        if pod.waiters and len(pod.gpu) > pod.slots:
            oldest = next(iter(pod.waiters.values()))
            since = oldest if since is None else min(since, oldest)
        if since is None or now - since < after_s:
            return None
        return self.lightest_holder(endpoint, pod)[0]

    def lightest_holder(self, endpoint: str, pod: PodResidency) -> tuple[str | None, int]:
        """The slot-holding adapter (not a waiter) with the fewest requests in flight, and that count."""
        _, lightest, count = self._slot_facts(endpoint, pod)
        return lightest, count

    def forget(self, keep: Iterable[str]) -> None:
        """Drop every pod not in `keep` (endpoints that left the pool)."""
        keep_set = set(keep)
        for endpoint in [e for e in self._pods if e not in keep_set]:
            pod = self._pods.pop(endpoint)
            self.slot_total -= pod.slots
            self._clear(endpoint, pod)

    def _evictable(self, endpoint: str, pod: PodResidency, adapter: str) -> bool:
        return adapter not in pod.observed_active and self._inflight.adapter_count(endpoint, adapter) == 0

    def _touch(self, endpoint: str, pod: PodResidency, adapter: str) -> None:
        pod.version += 1
        pod.gpu[adapter] = 1.0
        pod.gpu.move_to_end(adapter)
        pod.cpu.pop(adapter, None)
        homes = self._homes.setdefault(adapter, set())
        if endpoint not in homes:
            homes.add(endpoint)
            self._sorted_homes.pop(adapter, None)

    def _trim(self, endpoint: str, pod: PodResidency, keep: str | None) -> None:
        pod.version += 1
        while len(pod.gpu) > pod.slots:
            victim = next(
                (a for a in pod.gpu if a != keep and self._evictable(endpoint, pod, a)),
                None,
            )
            if victim is None:
                break  # every slot is busy: vLLM defers the new adapter; so do we
            del pod.gpu[victim]
            if pod.waiters:
                pod.waiters.popitem(last=False)  # the oldest waiter takes the freed slot
            self._drop_home(victim, endpoint)
            pod.cpu[victim] = None
            pod.cpu.move_to_end(victim)
            while len(pod.cpu) > pod.cpu_slots:
                pod.cpu.popitem(last=False)
        if pod.waiters and len(pod.gpu) <= pod.slots:
            pod.waiters.clear()

    def _clear(self, endpoint: str, pod: PodResidency) -> None:
        pod.version += 1
        for adapter in pod.gpu:
            self._drop_home(adapter, endpoint)
        pod.gpu.clear()
        pod.cpu.clear()
        pod.waiters.clear()

    def _drop_home(self, adapter: str, endpoint: str) -> None:
        homes = self._homes.get(adapter)
        if homes is not None and endpoint in homes:
            homes.discard(endpoint)
            self._sorted_homes.pop(adapter, None)
            if not homes:
                del self._homes[adapter]


_NO_HOMES: frozenset[str] = frozenset()
