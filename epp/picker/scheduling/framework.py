"""The plugin contract and the profile that runs it: filters → weighted scorers → picker.

Invariants every plugin keeps:
- a Filter returns a subset of the endpoints it was given, in their order;
- a Scorer returns one score in [0, 1] per endpoint given, in the same order, reading
  nothing but the request, those endpoints, the snapshot and the scheduler state;
- a Picker returns indexes into the endpoints it was given, best first, at least one.
Plugins are pure and synchronous; time is `ctx.now`.
"""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Callable, Container, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from epp.errors import EppError, ErrorCode
from epp.picker.datastore.types import EndpointState, Snapshot
from epp.picker.scheduling.ledger import BASE_MODEL
from epp.picker.scheduling.state import SchedulerState
from epp.picker.scheduling.types import LLMRequest, NamedCandidates, Scheduler, SchedulingResult


@dataclass(slots=True)
class ScheduleContext:
    """One decision's inputs; `memo` lets plugins share per-decision work (e.g. prompt hashes)."""

    request: LLMRequest
    snapshot: Snapshot
    now: float
    state: SchedulerState
    memo: dict[str, object] = field(default_factory=dict)
    reasons: dict[str, str] = field(default_factory=dict)  # endpoint name -> why (set by scorers)
    planned_homes: tuple[str, ...] = ()  # the placement plan's homes for the adapter (set by its scorer)


class Filter(Protocol):
    @property
    def name(self) -> str: ...

    def filter(self, ctx: ScheduleContext, endpoints: list[EndpointState]) -> list[EndpointState]: ...


class Scorer(Protocol):
    @property
    def name(self) -> str: ...

    def score(self, ctx: ScheduleContext, endpoints: Sequence[EndpointState]) -> list[float]: ...


class Picker(Protocol):
    @property
    def name(self) -> str: ...

    def pick(
        self, ctx: ScheduleContext, endpoints: Sequence[EndpointState], totals: Sequence[float]
    ) -> list[int]: ...


@runtime_checkable
class RoutingObserver(Protocol):
    """A plugin that learns from outcomes (e.g. the prefix scorer records the primary's blocks)."""

    def on_routed(self, request: LLMRequest, endpoint: EndpointState, now: float) -> None: ...


# (plugin kind, plugin name, seconds) — e.g. feeds a per-plugin latency histogram.
PluginTimer = Callable[[str, str, float], None]


@dataclass(frozen=True, slots=True)
class PluginTiming:
    """Optional per-plugin timing: `clock_s` is a monotonic clock, `observe` receives each duration."""

    clock_s: Callable[[], float]
    observe: PluginTimer


@dataclass(frozen=True, slots=True)
class WeightedScorer:
    scorer: Scorer
    weight: float


@dataclass(frozen=True, slots=True)
class Profile:
    """A straight line: every filter in order (stop when empty), weighted scorers summed, one picker."""

    name: str
    filters: tuple[Filter, ...]
    scorers: tuple[WeightedScorer, ...]
    picker: Picker

    def run(
        self,
        ctx: ScheduleContext,
        candidates: list[EndpointState],
        timing: PluginTiming | None = None,
    ) -> SchedulingResult:
        endpoints = candidates
        for flt in self.filters:
            start = timing.clock_s() if timing else 0.0
            endpoints = flt.filter(ctx, endpoints)
            if timing:
                timing.observe("filter", flt.name, timing.clock_s() - start)
            if not endpoints:
                raise EppError(
                    ErrorCode.RESOURCE_EXHAUSTED,
                    "failed to find candidate endpoints for serving the request",
                    reason=f"filter:{flt.name}",
                )
        totals = [0.0] * len(endpoints)
        per_scorer: list[tuple[str, list[float]]] = []
        for weighted in self.scorers:
            start = timing.clock_s() if timing else 0.0
            scores = weighted.scorer.score(ctx, endpoints)
            if timing:
                timing.observe("scorer", weighted.scorer.name, timing.clock_s() - start)
            if len(scores) != len(totals):
                raise ValueError(f"scorer {weighted.scorer.name} returned {len(scores)} scores")
            # Clamp (NaN counts as 0): a scorer bug must not let one plugin outweigh the rest.
            # Checked with builtins first; the per-score pass runs only for a misbehaving scorer.
            if scores and not (min(scores) >= 0.0 and max(scores) <= 1.0 and not math.isnan(sum(scores))):
                scores = [s if 0.0 <= s <= 1.0 else (1.0 if s > 1.0 else 0.0) for s in scores]
            w = weighted.weight
            totals = [t + w * s for t, s in zip(totals, scores)]  # noqa: B905  # lengths checked above
            per_scorer.append((weighted.scorer.name, scores))
        start = timing.clock_s() if timing else 0.0
        order = self.picker.pick(ctx, endpoints, totals)
        if timing:
            timing.observe("picker", self.picker.name, timing.clock_s() - start)
        chosen = tuple(endpoints[i] for i in order)
        # Per-endpoint detail only for the endpoints returned: cheap at 1000 candidates.
        scores_out = {endpoints[i].name: {name: s[i] for name, s in per_scorer} for i in order}
        totals_out = {endpoints[i].name: totals[i] for i in order}
        reason = ctx.reasons.get(chosen[0].name, self.picker.name)
        return SchedulingResult(
            endpoints=chosen,
            profile=self.name,
            reason=reason,
            scores=scores_out,
            total_scores=totals_out,
            planned_homes=ctx.planned_homes,
        )


def prefer_fresh(
    candidates: Sequence[EndpointState], now: float, staleness_threshold_s: float
) -> list[EndpointState]:
    """Fresh endpoints when any exist, else all of them (never pick stale over fresh)."""
    fresh = [c for c in candidates if c.is_fresh(now, staleness_threshold_s)]
    return fresh if fresh else list(candidates)


class ProfileScheduler:
    """A `Scheduler` that runs one profile and keeps the shared state up to date.

    Before the profile runs, candidates are narrowed to fresh ones when any is fresh, and
    every candidate's scrape is folded into the residency model.
    """

    def __init__(
        self,
        name: str,
        profile: Profile,
        state: SchedulerState,
        *,
        observers: Sequence[RoutingObserver] = (),
        timing: PluginTiming | None = None,
        forget_every: int = 1024,
        max_scored_endpoints: int = 0,
    ) -> None:
        self.name = name
        self.profile = profile
        self.state = state
        self._observers = tuple(observers)
        self._timing = timing
        self._forget_every = forget_every
        self._decisions = 0
        # 0 = score every candidate. Otherwise, above this many fresh candidates, score the
        # adapter's homes plus a seeded random sample of the rest ("power of d choices"):
        # decision time stays flat with pool size at a negligible cost in placement.
        self._max_scored = max_scored_endpoints
        self._observed_snapshot: Snapshot | None = None
        self._view: _FreshView | None = None
        self._pool: _FreshView | None = None  # the whole snapshot's, for sampling part of it

    def schedule(
        self, request: LLMRequest, candidates: Sequence[EndpointState], snapshot: Snapshot, now: float
    ) -> SchedulingResult:
        if not candidates:
            raise EppError(ErrorCode.SERVICE_UNAVAILABLE, "no candidate endpoints", reason="no-endpoints")
        self._decisions += 1
        if self._decisions % self._forget_every == 0:
            self._forget(snapshot)
        residency = self.state.residency
        if snapshot is not self._observed_snapshot:  # a snapshot is immutable: fold it in once
            for c in snapshot.endpoints:
                residency.observe(c)
            if candidates is not snapshot.endpoints:
                for c in candidates:
                    residency.observe(c)
            self._observed_snapshot = snapshot
            pool = tuple(e.endpoint.name for e in snapshot.endpoints)
            if pool != self.state.pool:
                self.state.pool = pool
        ctx = ScheduleContext(request=request, snapshot=snapshot, now=now, state=self.state)
        if self._max_scored and candidates is not snapshot.endpoints and len(candidates) > self._max_scored:
            # Part of a large pool (flow control's gate, a subset hint): sample from the pool's
            # view, which lasts while the snapshot does, and keep what is among the candidates,
            # instead of building a view of a list that differs at every decision.
            names: Container[str] = (
                candidates.names
                if isinstance(candidates, NamedCandidates)
                else {e.endpoint.name for e in candidates}
            )
            sampled = self._sample(request, self._pool_view(snapshot, now), names)
            if len(sampled) >= min(self._max_scored, len(candidates)) // 2:
                return self.profile.run(ctx, sampled, self._timing)
        view = self._view
        if view is None or not view.valid(snapshot, candidates, now):
            view = self._view = _FreshView.build(snapshot, candidates, now, self.state.staleness_threshold_s)
        usable = view.fresh
        if self._max_scored and len(usable) > self._max_scored:
            usable = self._sample(request, view)
        return self.profile.run(ctx, list(usable), self._timing)

    def _pool_view(self, snapshot: Snapshot, now: float) -> _FreshView:
        view = self._pool
        if view is None or not view.valid(snapshot, snapshot.endpoints, now):
            view = self._pool = _FreshView.build(
                snapshot, snapshot.endpoints, now, self.state.staleness_threshold_s
            )
        return view

    def _sample(
        self, request: LLMRequest, view: _FreshView, allowed: Container[str] | None = None
    ) -> list[EndpointState]:
        """At most `max_scored_endpoints`: the adapter's homes (up to three quarters of them,
        a random subset when there are more; its planned homes fill what is left of that
        share) plus a random sample of the other endpoints; with `allowed`, only those.

        The others always get a quarter or more, so spill-over and free slots stay in view for
        an adapter with many homes. O(homes + sample), not O(pool): the pool is only indexed.
        """
        rng = self.state.rng
        residency = self.state.residency
        by_name = view.by_name
        usable: Container[str] = by_name.keys() if allowed is None else allowed
        adapter = request.target_model
        keep = [by_name[h] for h in residency.sorted_homes(adapter) if h in usable and h in by_name]
        home_cap = self._max_scored - self._max_scored // 4
        homes = residency.homes(adapter)
        if len(keep) > home_cap:
            keep = rng.sample(keep, home_cap)
        else:  # room left: where the placement plan puts the adapter, so replicas agree at any pool size
            planned = (
                by_name[h]
                for h in self.state.plan.planned_homes(adapter)
                if h in usable and h in by_name and h not in homes
            )
            keep.extend(itertools.islice(planned, home_cap - len(keep)))
        room = self._max_scored - len(keep)
        kept = {e.endpoint.name for e in keep}
        if allowed is None:
            window = view.window(rng, room + len(keep))
            extra = [e for e in window if e.endpoint.name not in homes and e.endpoint.name not in kept]
            return keep + extra[:room]
        # Part of the pool allowed: walk the shuffled pool from a random point until `room` are found.
        extra = []
        if room > 0:
            for e in view.walk(rng):
                name = e.endpoint.name
                if name in allowed and name not in homes and name not in kept:
                    extra.append(e)
                    if len(extra) == room:
                        break
        return keep + extra

    def on_routed(self, request: LLMRequest, result: SchedulingResult, now: float) -> None:
        for observer in self._observers:
            observer.on_routed(request, result.primary, now)

    def _forget(self, snapshot: Snapshot) -> None:
        names = [e.name for e in snapshot.endpoints]
        if names:
            self.state.residency.forget(names)
            self.state.inflight.forget(set(names))
            for observer in self._observers:
                forget = getattr(observer, "forget", None)
                if callable(forget):
                    forget(names)


@dataclass(frozen=True, slots=True)
class _FreshView:
    """The usable candidates of one (snapshot, candidates) pair, valid until the first fresh one ages out."""

    snapshot: Snapshot
    candidates: Sequence[EndpointState]
    fresh: list[EndpointState]
    by_name: dict[str, EndpointState]
    valid_until: float
    built_at: float
    # `fresh` in a random order, twice over, made on first use: a decision's sample is a window
    # at a random offset, so each endpoint is equally likely to be drawn at one RNG call per
    # decision rather than one per endpoint drawn.
    _shuffled: list[list[EndpointState]] = field(default_factory=list)

    def window(self, rng: random.Random, size: int) -> list[EndpointState]:
        """`size` distinct fresh endpoints (all of them when there are no more) in random order."""
        n = len(self.fresh)
        if size >= n:
            return self.fresh
        twice = self._twice_shuffled(rng)
        start = rng.randrange(n)
        return twice[start : start + size]

    def _twice_shuffled(self, rng: random.Random) -> list[EndpointState]:
        if not self._shuffled:
            order = rng.sample(self.fresh, len(self.fresh))
            self._shuffled.append(order + order)
        return self._shuffled[0]

    def walk(self, rng: random.Random) -> Iterator[EndpointState]:
        """Every fresh endpoint once, in the shuffled order from a random point (lazily)."""
        n = len(self.fresh)
        if n == 0:
            return iter(())
        twice = self._twice_shuffled(rng)
        start = rng.randrange(n)
        return itertools.islice(twice, start, start + n)

    @classmethod
    def build(
        cls, snapshot: Snapshot, candidates: Sequence[EndpointState], now: float, staleness_threshold_s: float
    ) -> _FreshView:
        fresh = prefer_fresh(candidates, now, staleness_threshold_s)
        expiries = [
            e.metrics.updated_at + staleness_threshold_s
            for e in fresh
            if e.is_fresh(now, staleness_threshold_s) and e.metrics
        ]
        valid_until = min(expiries) if expiries else float("inf")
        return cls(snapshot, candidates, fresh, {e.endpoint.name: e for e in fresh}, valid_until, now)

    def valid(self, snapshot: Snapshot, candidates: Sequence[EndpointState], now: float) -> bool:
        # Same immutable inputs, and no fresh endpoint has turned stale since (time only ages).
        return (
            snapshot is self.snapshot
            and candidates is self.candidates
            and self.built_at <= now <= self.valid_until
        )


def record_routed(scheduler: Scheduler, request: LLMRequest, result: SchedulingResult, now: float) -> None:
    """What sending `request` to `result.primary` changes: the scheduler's plugins learn the pick,
    and its routing ledger counts the request in flight there (under the request's key)."""
    scheduler.on_routed(request, result, now)
    state = scheduler.state
    adapter = BASE_MODEL if is_base_model(request, state, result.endpoints) else request.target_model
    state.ledger.routed(request.request_id, result.primary.name, adapter, now)


def is_base_model(request: LLMRequest, state: SchedulerState, endpoints: Sequence[EndpointState]) -> bool:
    """True when the request names the base model (needs no LoRA slot) rather than an adapter."""
    target = request.target_model
    if not target or target in state.base_models:
        return True
    for e in endpoints:
        m = e.metrics
        if m is not None and m.served_model_name is not None:
            return m.served_model_name == target
    return False
