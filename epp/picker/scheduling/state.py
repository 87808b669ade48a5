"""State a scheduler keeps between decisions: the routing ledger (in flight, residency, popularity),
the placement plan, the learned costs, randomness.

One `SchedulerState` per scheduler; every plugin of that scheduler shares it. All of it
is bounded (see each part) and advanced only by the caller's `now`.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from epp.picker.scheduling.costs import CostEstimator
from epp.picker.scheduling.inflight import InflightTracker
from epp.picker.scheduling.ledger import RoutingLedger
from epp.picker.scheduling.plan import HomePlan
from epp.picker.scheduling.popularity import AdapterPopularity
from epp.picker.scheduling.residency import ResidencyModel


@dataclass(slots=True)
class SchedulerState:
    rng: random.Random
    staleness_threshold_s: float
    inflight: InflightTracker = field(default_factory=InflightTracker)
    popularity: AdapterPopularity = field(default_factory=AdapterPopularity)
    plan: HomePlan = field(default_factory=HomePlan)
    residency: ResidencyModel = field(init=False)
    # Every change routing makes to `inflight`, `residency` and `popularity` goes through it.
    ledger: RoutingLedger = field(init=False)
    base_models: frozenset[str] = frozenset()  # names that are the base model, not an adapter
    # The pool's endpoint names as of the last snapshot, one tuple until the pool changes: the
    # placement plan ranks pods over the pool, not over one request's (filtered, sampled) candidates.
    pool: tuple[str, ...] = ()
    # What each choice costs per pod, learned from this scheduler's own requests; None until a
    # plugin that prices choices asks for it (`cost_learning.learned_costs`).
    costs: CostEstimator | None = None

    def __post_init__(self) -> None:
        self.residency = ResidencyModel(self.inflight)
        self.ledger = RoutingLedger(self.inflight, self.residency, self.popularity)

    @classmethod
    def create(cls, *, seed: int | None, staleness_threshold_s: float) -> SchedulerState:
        return cls(rng=random.Random(seed), staleness_threshold_s=staleness_threshold_s)

    def adapter_in_flight(self, endpoint: str, adapter: str) -> bool:
        """Whether a request for `adapter` routed to `endpoint` has not finished yet."""
        return self.inflight.adapter_count(endpoint, adapter) > 0

    def adapter_in_gpu_slot(self, endpoint: str, adapter: str) -> bool:
        """Whether the residency model has `adapter` in one of `endpoint`'s GPU slots."""
        pod = self.residency.pod(endpoint)
        return pod is not None and adapter in pod.gpu
