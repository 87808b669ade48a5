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
from dataclasses import dataclass

from epp.picker.datastore.types import EndpointState
from epp.picker.scheduling.framework import ScheduleContext, is_base_model
from epp.picker.scheduling.scorers.load_signals import effective_loads


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

    def score(self, ctx: ScheduleContext, endpoints: Sequence[EndpointState]) -> list[float]:
        state = ctx.state
        request = ctx.request
        n = len(endpoints)
        if is_base_model(request, state, endpoints):
            for e in endpoints:
                ctx.reasons[e.endpoint.name] = "base-model"
            return [1.0] * n
        adapter = request.target_model
        now = ctx.now
        inflight = state.inflight
        residency = state.residency
        popularity = state.popularity
        loads = effective_loads(ctx, endpoints)
        least = min(loads)
        spill_above = least + self.spill_queue_threshold + self.spill_load_ratio * least
        homes = residency.homes(adapter)
        share = popularity.share(adapter, now)
        desired_homes = max(1, math.ceil(share * n * self.home_spread))
        widen = len(homes) < desired_homes
        free_score = self.widen_slot if widen else self.free_slot
        target_rate = popularity.rate(adapter, now)
        default_slots = residency.params.default_max_lora
        pods = residency.pods
        get_pod = pods.get
        adapter_count = inflight.adapter_count
        drain_after_s = self.drain_after_s
        reasons = ctx.reasons
        out: list[float] = []
        append = out.append
        for i, e in enumerate(endpoints):
            name = e.endpoint.name
            m = e.metrics
            if m is not None and not m.lora_enabled and m.max_lora == 0:
                # Scraped without the LoRA family: this pod serves no adapters.
                append(0.0)
                reasons[name] = "no-lora"
                continue
            pod = get_pod(name)
            # Our routing and every scrape put an in-flight adapter into its pod's GPU set, and
            # an adapter with requests in flight is never evicted: so homes ⊇ active pods.
            if pod is not None and name in homes:
                # Only a pod with a slot waiter or deferred requests can be draining.
                if (pod.waiters or pod.deferred_since is not None) and adapter == residency.drain_target(
                    name, pod, now, drain_after_s
                ):
                    append(self.draining_home)
                    reasons[name] = "draining-home"
                elif loads[i] > spill_above:
                    append(self.saturated_home)
                    reasons[name] = "saturated-home"
                elif adapter in pod.observed_active or adapter_count(name, adapter) > 0:
                    append(self.active)
                    reasons[name] = "adapter-active"
                else:
                    conf = pod.gpu.get(adapter, 1.0)
                    append(self.free_slot + (self.resident - self.free_slot) * conf)
                    reasons[name] = "adapter-resident"
                continue
            deferred = m is not None and m.deferred_requests > 0
            if pod is not None:
                free = pod.slots - len(pod.gpu)
            else:
                free = m.max_lora if m and m.max_lora else default_slots
            if free > 0 and not deferred:
                append(free_score)
                reasons[name] = "free-slot"
                continue
            victim = residency.victim(name, pod) if pod is not None else None
            if victim is None:
                append(0.0)  # every slot is busy: the request would wait for one
                reasons[name] = "slot-wait"
                continue
            victim_rate = popularity.rate(victim, now)
            victim_homes = residency.homes(victim)
            if len(victim_homes) <= 1 and victim_rate > self.protect_ratio * (target_rate + 1.0):
                append(0.0)  # never evict a hotter adapter's only home for a colder one
                reasons[name] = "evict-protected"
                continue
            coldness = (target_rate + 1.0) / (target_rate + victim_rate + 2.0)
            value = self.evict * coldness
            if pod is not None and adapter in pod.cpu:
                value = min(self.evict, value + self.cpu_tier_bonus)
            append(value)
            reasons[name] = "evict"
        return out
