"""`adapter-affinity-scorer`: our LoRA placement score, from residency rather than in-flight activity.

Tiers for a request naming adapter A, per pod:
- A in flight there (our routing or the scrape): `active` (1.0).
- A modelled resident in a GPU slot, idle: from `freeSlot` up to `resident` (0.85), by confidence.
- A free GPU slot (no request deferred for a slot): `freeSlot` (0.6), or `widenSlot` (0.8)
  while A has fewer homes than its traffic share asks for.
- Full: loading A evicts the LRU idle adapter V: up to `evict` (0.2), higher the colder V
  is; 0 when V is a much hotter adapter's only home, or when every slot is busy (A would
  wait).
A home (active or resident) whose load (waiting + running + routed since the scrape)
exceeds the candidates' least by more than `spillQueueThreshold` + `spillLoadRatio` × that
least is a hotspot: it scores `saturatedHome` (0.4), below a free slot, so
traffic spills to a new home while popular adapters widen their home sets
(desired homes = ⌈traffic share × pods × `homeSpread`⌉, at least 1). Rare adapters keep
one home and land where eviction hurts least. Base-model requests need no slot: 1.0.

Where a new home goes follows the placement plan (`plan.HomePlan`: rendezvous order over
pod names, sized from the same desired count): a free slot on a planned home scores
`plannedHomeScore` (0.1) more than another free slot (while widening, the others score that
much less instead, so a resident home keeps its margin over any free slot), and a swap there
`plannedSwapScore` (0.01) more, a tie-break only. So EPP replicas, or one EPP after a
restart, put an adapter on the same pods instead of wherever load ties fall.

Misses priced (`priceMisses`, off by default): a free slot's or a swap's margin below an active
home is multiplied by what loading the adapter there costs over a hit's TTFT on that pod, both
learned from the EPP's own requests (`scheduling.costs`; a host-memory copy when the residency
view has the adapter in that pod's host tier, a storage read otherwise). Where a load takes a hit's
TTFT or longer (storage, or any load on a GPU) nothing changes; where it is a copy from host memory
of a tenth of one the margin is a tenth, and load decides: an adapter follows the free capacity
instead of queueing behind its own home. Only while the pool has slots to spare (the adapters with
requests in flight fill at most `pricingSlotShare`, 0.75, of the GPU slots the residency view
knows): beyond that a load takes a slot another adapter will wait for, which the copy's price
does not say, and the fixed scores hold.

Starvation guard: on a pod where a request has waited `drainAfterSeconds` (1) for a LoRA
slot (the scrape reports deferred requests, or we sent more busy adapters than it has
slots), the slot holder with the fewest requests in flight is drained: as a home it
scores `drainingHome` (0.05), below any pod that could take the request now, so it
finishes and the waiting adapter gets its slot. Without this a rare adapter behind four
busy hot ones waits as long as they keep getting traffic.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from epp.picker.datastore.types import EndpointState
from epp.picker.scheduling.cost_learning import note_routed
from epp.picker.scheduling.costs import CostEstimator
from epp.picker.scheduling.framework import ScheduleContext, is_base_model
from epp.picker.scheduling.residency import PodResidency
from epp.picker.scheduling.scorers.load_signals import effective_loads
from epp.picker.scheduling.state import SchedulerState
from epp.picker.scheduling.types import LLMRequest

# The reasons that load the adapter on the pod, whose margin below a home is priced.
_MISSES = frozenset({"free-slot", "planned-free-slot", "evict", "planned-evict"})


@dataclass(frozen=True, slots=True)
class AdapterAffinityScorer:
    name: str = "adapter-affinity-scorer"
    active: float = 1.0
    resident: float = 0.85
    free_slot: float = 0.6
    widen_slot: float = 0.8
    evict: float = 0.2
    saturated_home: float = 0.4
    draining_home: float = 0.05
    drain_after_s: float = 1.0
    spill_queue_threshold: float = 16.0  # requests
    spill_load_ratio: float = 0.5  # plus this multiple of the least-loaded candidate's load
    home_spread: float = 1.0
    cpu_tier_bonus: float = 0.02
    protect_ratio: float = 2.0  # a sole home is protected from adapters this many times colder
    planned_home: float = 0.1  # a planned home's free slot over the others (while widening: off the others)
    planned_swap: float = 0.01  # added to a swap there: a tie-break, the victim's coldness still rules
    state: SchedulerState | None = field(default=None, repr=False)  # needed with `costs`
    costs: CostEstimator | None = None  # learned per-pod costs: misses priced (None: fixed scores)
    pricing_slot_share: float = 0.75  # price misses only while busy adapters fill at most this share of slots

    def score(self, ctx: ScheduleContext, endpoints: Sequence[EndpointState]) -> list[float]:
        reasons = ctx.reasons
        if is_base_model(ctx.request, ctx.state, endpoints):
            for e in endpoints:
                reasons[e.endpoint.name] = "base-model"
            return [1.0] * len(endpoints)
        placement = self._placement(ctx, endpoints)
        ctx.planned_homes = ctx.state.plan.planned_homes(placement.adapter)
        out: list[float] = []
        append = out.append
        costs = self.costs
        if costs is not None and not self._slots_to_spare(ctx.state):
            costs = None
        for i, e in enumerate(endpoints):
            value, reason = self._score_pod(ctx.state, placement, e, placement.loads[i])
            if costs is not None and reason in _MISSES:
                value = self._priced(ctx.state, costs, placement.adapter, e.endpoint.name, value)
            append(value)
            reasons[e.endpoint.name] = reason
        return out

    def _slots_to_spare(self, state: SchedulerState) -> bool:
        """Whether the pool has GPU slots beyond the adapters in flight: when those fill them, a load
        takes a slot some other adapter will wait for, and that wait, not the copy, is its price."""
        return state.inflight.adapters_in_flight <= self.pricing_slot_share * state.residency.slot_total

    def _priced(
        self, state: SchedulerState, costs: CostEstimator, adapter: str, name: str, value: float
    ) -> float:
        """A miss's margin below a home, scaled by what a miss costs on that pod over a hit's TTFT
        there: kept whole where a load takes as long as a hit or longer, shrunk where it is a copy
        from host memory that takes a fraction of one."""
        pod_costs = costs.pod(name)
        pod = state.residency.pods.get(name)
        price = pod_costs.host_load_s if pod is not None and adapter in pod.cpu else pod_costs.storage_load_s
        hit = pod_costs.hit_s
        if hit <= 0 or price >= hit:
            return value
        return self.active - (self.active - value) * (price / hit)

    def on_routed(self, request: LLMRequest, endpoint: EndpointState, now: float) -> None:
        """With learned costs: note the pick, so its outcome prices this pod's misses."""
        if self.costs is not None and self.state is not None:
            note_routed(self.state, self.costs, request, endpoint)

    def forget(self, names: list[str]) -> None:
        if self.costs is not None:
            self.costs.forget(names)

    def _placement(self, ctx: ScheduleContext, endpoints: Sequence[EndpointState]) -> _Placement:
        """The per-request facts every pod's score shares, computed once per decision."""
        adapter = ctx.request.target_model
        now = ctx.now
        popularity = ctx.state.popularity
        loads = effective_loads(ctx, endpoints)
        least = min(loads)
        homes = ctx.state.residency.homes(adapter)
        share = popularity.share(adapter, now)
        desired_homes = max(1, math.ceil(share * len(endpoints) * self.home_spread))
        pool = ctx.state.pool or tuple(e.endpoint.name for e in endpoints)
        planned_homes = max(1, math.ceil(share * len(pool) * self.home_spread))
        return _Placement(
            adapter=adapter,
            now=now,
            loads=loads,
            spill_above=least + self.spill_queue_threshold + self.spill_load_ratio * least,
            homes=homes,
            planned=ctx.state.plan.plan_homes(adapter, pool, planned_homes),
            # Too few homes for its traffic: a free slot elsewhere widens the set, so it scores higher.
            free_score=self.widen_slot if len(homes) < desired_homes else self.free_slot,
            target_rate=popularity.rate(adapter, now),
        )

    def _score_pod(
        self, state: SchedulerState, placement: _Placement, e: EndpointState, load: float
    ) -> tuple[float, str]:
        """One pod's score and its reason: home, free slot, or the cost of a swap, in that order."""
        name = e.endpoint.name
        m = e.metrics
        if m is not None and not m.lora_enabled and m.max_lora == 0:
            return 0.0, "no-lora"  # scraped without the LoRA family: this pod serves no adapters
        residency = state.residency
        pod = residency.pods.get(name)
        # Our routing and every scrape put an in-flight adapter into its pod's GPU set, and
        # an adapter with requests in flight is never evicted: so homes ⊇ active pods.
        if pod is not None and name in placement.homes:
            return self._home_score(state, placement, name, pod, load)
        deferred = m is not None and m.deferred_requests > 0
        if pod is not None:
            free = pod.slots - len(pod.gpu)
        else:
            free = m.max_lora if m and m.max_lora else residency.params.default_max_lora
        if free > 0 and not deferred:
            # The plan picks among new homes and never narrows the margin of an old one: while
            # widening, the planned free slot keeps `widenSlot` and the others drop below it.
            widening = placement.free_score > self.free_slot
            if name in placement.planned:
                bonus = 0.0 if widening else self.planned_home
                return placement.free_score + bonus, "planned-free-slot"
            malus = self.planned_home if widening else 0.0
            return max(self.free_slot, placement.free_score - malus), "free-slot"
        return self._swap_score(state, placement, name, pod)

    def _home_score(
        self, state: SchedulerState, placement: _Placement, name: str, pod: PodResidency, load: float
    ) -> tuple[float, str]:
        """A pod already holding the adapter: best, unless it is being drained or is a hotspot."""
        adapter = placement.adapter
        # Only a pod with a slot waiter or deferred requests can be draining.
        if (pod.waiters or pod.deferred_since is not None) and adapter == state.residency.drain_target(
            name, pod, placement.now, self.drain_after_s
        ):
            return self.draining_home, "draining-home"
        if load > placement.spill_above:
            return self.saturated_home, "saturated-home"
        if adapter in pod.observed_active or state.inflight.adapter_count(name, adapter) > 0:
            return self.active, "adapter-active"
        conf = pod.gpu.get(adapter, 1.0)
        return self.free_slot + (self.resident - self.free_slot) * conf, "adapter-resident"

    def _swap_score(
        self, state: SchedulerState, placement: _Placement, name: str, pod: PodResidency | None
    ) -> tuple[float, str]:
        """A full pod: loading the adapter evicts the LRU idle one, worth more the colder that is."""
        victim = state.residency.victim(name, pod) if pod is not None else None
        if victim is None:
            return 0.0, "slot-wait"  # every slot is busy: the request would wait for one
        target_rate = placement.target_rate
        victim_rate = state.popularity.rate(victim, placement.now)
        victim_homes = state.residency.homes(victim)
        if len(victim_homes) <= 1 and victim_rate > self.protect_ratio * (target_rate + 1.0):
            return 0.0, "evict-protected"  # never evict a hotter adapter's only home for a colder one
        coldness = (target_rate + 1.0) / (target_rate + victim_rate + 2.0)
        value = self.evict * coldness
        if pod is not None and placement.adapter in pod.cpu:
            value = min(self.evict, value + self.cpu_tier_bonus)
        if name in placement.planned:
            return value + self.planned_swap, "planned-evict"
        return value, "evict"


@dataclass(frozen=True, slots=True)
class _Placement:
    """Where the requested adapter stands across the candidates: its homes, traffic and the load bar."""

    adapter: str
    now: float
    loads: list[float]
    spill_above: float  # a home loaded above this is a hotspot
    homes: frozenset[str] | set[str]
    planned: frozenset[str]  # the plan's homes for the adapter, planned over the whole pool
    free_score: float  # `widenSlot` while the adapter has fewer homes than its traffic asks for
    target_rate: float
