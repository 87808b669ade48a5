"""What each routing choice costs, learned per pod from how the EPP's own requests went.

The adapter-affinity score prices a miss with fixed weights. Whether a miss matters depends on
the pool: an adapter copied from host memory costs a few milliseconds, one read from storage
hundreds. So the EPP learns, per pod, from observations it already has:

- at routing: the pod, its load then (waiting + running + routed since its scrape) and where the
  adapter stood by the EPP's residency view (`Tier`: in a GPU slot, in host memory, nowhere);
- at finish: the request's time to first byte after dispatch (`epp serve`: the gateway's access
  log, minus the time the request spent in the EPP; `epp bench`: the pod model's first token).

Per pod it keeps
- a hit's TTFT as a line in the load, `hit_s + per_load_s · load` (an exponentially weighted
  least-squares fit over hits, its slope held toward the prior by a ridge), the queueing term;
- the extra TTFT of a host-memory load and of a storage load: exponentially weighted means of
  what a miss took above the hit line at its load.

Every update is O(1). A pod seen for the first time starts from the pool's estimates (fed by every
observation), the pool from `CostPriors`. Estimates follow the data as a running mean while it is
shorter than `1/alpha`, then as an exponentially weighted one: after n observations of a kind at
a changed cost, (1 − alpha)^n of the old gap remains (at the default 0.05: 5 % after 60, 0.6 %
after 100). From the priors, 400 requests (a quarter of each miss kind) bring every estimate within
20 % of a pod's true costs (`tests/unit/picker/scheduling/test_costs.py`).
"""

from __future__ import annotations

import enum
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field, replace


class Tier(enum.Enum):
    """Where a request's adapter stood on its pod when it was routed (by the EPP's residency view)."""

    HIT = "gpu"  # in a GPU slot (or the base model): no load
    HOST = "host"  # in the pod's host-memory tier: a host → GPU copy
    STORAGE = "storage"  # nowhere on the pod: a read from storage, then the copy


@dataclass(frozen=True, slots=True)
class CostPriors:
    """Where estimates start. The storage prior is far above the queueing prior, so before any
    observation a miss outweighs a few requests of load, as the fixed affinity does."""

    hit_s: float = 0.05  # TTFT of a hit on an idle pod
    per_load_s: float = 0.002  # TTFT added per outstanding request on the pod
    host_load_s: float = 0.005  # extra TTFT when the adapter comes from host memory
    storage_load_s: float = 0.2  # extra TTFT when it comes from storage
    weight: float = 5.0  # the priors count as this many observations
    ridge: float = 25.0  # holds the slope toward `per_load_s` (units: load² × observations)
    alpha: float = 0.05  # weight of the newest observation once the data outweighs the prior

    def __post_init__(self) -> None:
        if min(self.hit_s, self.per_load_s, self.host_load_s, self.storage_load_s) < 0:
            raise ValueError("cost priors must not be negative")
        if self.weight <= 0 or self.ridge <= 0 or not 0 < self.alpha < 1:
            raise ValueError("need weight > 0, ridge > 0 and 0 < alpha < 1")


@dataclass(slots=True)
class PodCosts:
    """One pod's estimates and the weighted sums behind them."""

    priors: CostPriors
    host_load_s: float = 0.0
    storage_load_s: float = 0.0
    hits: int = 0
    host_loads: int = 0
    storage_loads: int = 0
    # Exponentially weighted sums over hits: weight, Σx, Σy, Σx², Σxy (x = load, y = TTFT).
    _w: float = 0.0
    _x: float = 0.0
    _y: float = 0.0
    _xx: float = 0.0
    _xy: float = 0.0
    hit_s: float = 0.0  # predicted TTFT of a hit on an idle pod
    per_load_s: float = 0.0  # predicted TTFT added per outstanding request

    @classmethod
    def from_priors(cls, priors: CostPriors) -> PodCosts:
        w = priors.weight
        costs = cls(priors, host_load_s=priors.host_load_s, storage_load_s=priors.storage_load_s)
        costs._w, costs._y = w, w * priors.hit_s
        costs.hit_s, costs.per_load_s = priors.hit_s, priors.per_load_s
        return costs

    def copy(self) -> PodCosts:
        """The same estimates with no observations of its own (a new pod starting from the pool's)."""
        return replace(self, hits=0, host_loads=0, storage_loads=0)

    def hit_at(self, load: float) -> float:
        return self.hit_s + self.per_load_s * load

    def extra(self, tier: Tier) -> float:
        """The predicted price of `tier` over a hit."""
        if tier is Tier.HIT:
            return 0.0
        return self.host_load_s if tier is Tier.HOST else self.storage_load_s

    def predict(self, tier: Tier, load: float) -> float:
        return self.hit_at(load) + self.extra(tier)

    def observe(self, tier: Tier, load: float, ttft_s: float) -> None:
        """One finished request: O(1)."""
        priors = self.priors
        if tier is Tier.HIT:
            self.hits += 1
            keep = 1.0 - priors.alpha
            self._w = self._w * keep + 1.0
            self._x = self._x * keep + load
            self._y = self._y * keep + ttft_s
            self._xx = self._xx * keep + load * load
            self._xy = self._xy * keep + load * ttft_s
            self._fit()
            return
        residual = max(0.0, ttft_s - self.hit_at(load))
        if tier is Tier.HOST:
            self.host_loads += 1
            self.host_load_s += self._rate(self.host_loads) * (residual - self.host_load_s)
        else:
            self.storage_loads += 1
            self.storage_load_s += self._rate(self.storage_loads) * (residual - self.storage_load_s)

    def _rate(self, n: int) -> float:
        """A running mean over the prior's pseudo-observations and the first n, then alpha."""
        return max(self.priors.alpha, 1.0 / (self.priors.weight + n))

    def _fit(self) -> None:
        priors = self.priors
        w = self._w
        mean_x = self._x / w
        mean_y = self._y / w
        var = self._xx - self._x * mean_x
        cov = self._xy - self._x * mean_y
        slope = max(0.0, (cov + priors.ridge * priors.per_load_s) / (var + priors.ridge))
        self.per_load_s = slope
        self.hit_s = max(0.0, mean_y - slope * mean_x)


@dataclass(frozen=True, slots=True)
class _Pending:
    endpoint: str
    tier: Tier
    load: float


@dataclass(slots=True)
class CostEstimator:
    """Per-pod `PodCosts`, and what each routed request's observation needs until it finishes.

    Memory: one entry per pod (dropped by `forget`) and at most `max_pending` requests in flight.
    """

    priors: CostPriors = field(default_factory=CostPriors)
    max_pending: int = 100_000
    pool: PodCosts = field(init=False)
    _pods: dict[str, PodCosts] = field(default_factory=dict)
    _pending: OrderedDict[str, _Pending] = field(default_factory=OrderedDict)

    def __post_init__(self) -> None:
        self.pool = PodCosts.from_priors(self.priors)

    def start_from(self, priors: CostPriors) -> None:
        """Replace the priors before anything was observed (a config's plugins are built in turn)."""
        if self._pods or self._pending:
            raise RuntimeError("priors can change only before the first request")
        self.priors = priors
        self.pool = PodCosts.from_priors(priors)

    def pod(self, endpoint: str) -> PodCosts:
        """`endpoint`'s estimates; a pod not seen yet reads the pool's."""
        return self._pods.get(endpoint) or self.pool

    @property
    def pods(self) -> Mapping[str, PodCosts]:
        """Endpoint name → its own estimates (pods with observations only; read-only)."""
        return self._pods

    def routed(self, key: str, endpoint: str, tier: Tier, load: float) -> None:
        """Request `key` went to `endpoint` at `load`, its adapter at `tier` there."""
        pending = self._pending
        pending[key] = _Pending(endpoint, tier, load)
        if len(pending) > self.max_pending:
            pending.popitem(last=False)

    def finished(self, key: str, endpoint: str, ttft_s: float | None) -> None:
        """Request `key` finished on `endpoint`; `ttft_s` from its dispatch to its first byte, None
        when unknown. A key routed again elsewhere ends its first flight with another endpoint:
        that one is not the pending pick and is ignored."""
        entry = self._pending.get(key)
        if entry is None or entry.endpoint != endpoint:
            return
        del self._pending[key]
        if ttft_s is None or ttft_s < 0:
            return
        costs = self._pods.get(entry.endpoint)
        if costs is None:
            costs = self._pods[entry.endpoint] = self.pool.copy()
        costs.observe(entry.tier, entry.load, ttft_s)
        self.pool.observe(entry.tier, entry.load, ttft_s)

    def forget(self, keep: list[str]) -> None:
        """Drop the estimates of pods not in `keep` (they left the pool)."""
        kept = set(keep)
        for endpoint in [e for e in self._pods if e not in kept]:
            del self._pods[endpoint]

    def __len__(self) -> int:
        return len(self._pending)
