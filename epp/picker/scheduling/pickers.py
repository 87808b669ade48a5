"""Pickers: turn total scores into endpoints in preference order (primary, then fallbacks)."""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass

from epp.picker.datastore.types import EndpointState
from epp.picker.scheduling.framework import ScheduleContext


@dataclass(frozen=True, slots=True)
class MaxScorePicker:
    """Highest total first, ties broken at random; at most `max_endpoints` (upstream `maxNumOfEndpoints`)."""

    name: str = "max-score-picker"
    max_endpoints: int = 1

    def pick(
        self, ctx: ScheduleContext, endpoints: Sequence[EndpointState], totals: Sequence[float]
    ) -> list[int]:
        rng = ctx.state.rng
        if self.max_endpoints == 1:
            best = max(totals)
            ties = [i for i, t in enumerate(totals) if t == best]
            return [ties[0] if len(ties) == 1 else ties[rng.randrange(len(ties))]]
        k = min(self.max_endpoints, len(totals))
        order = heapq.nlargest(k, range(len(totals)), key=totals.__getitem__)
        cut = totals[order[-1]]
        above = [i for i in order if totals[i] > cut]
        above.sort(key=lambda i: (-totals[i], rng.random()))  # random order within equal scores
        ties = [i for i, t in enumerate(totals) if t == cut]
        return above + rng.sample(ties, k - len(above))


@dataclass(frozen=True, slots=True)
class RandomPicker:
    """Uniformly random, ignoring scores; at most `max_endpoints` distinct endpoints."""

    name: str = "random-picker"
    max_endpoints: int = 1

    def pick(
        self, ctx: ScheduleContext, endpoints: Sequence[EndpointState], totals: Sequence[float]
    ) -> list[int]:
        k = min(self.max_endpoints, len(endpoints))
        return ctx.state.rng.sample(range(len(endpoints)), k)


@dataclass(frozen=True, slots=True)
class WeightedRandomPicker:
    """A-Res weighted sampling without replacement: key `U^(1/score)`, top k; all zero → uniform."""

    name: str = "weighted-random-picker"
    max_endpoints: int = 1

    def pick(
        self, ctx: ScheduleContext, endpoints: Sequence[EndpointState], totals: Sequence[float]
    ) -> list[int]:
        rng = ctx.state.rng
        k = min(self.max_endpoints, len(endpoints))
        if not any(t > 0 for t in totals):
            return rng.sample(range(len(endpoints)), k)
        keyed = [
            ((rng.random() ** (1.0 / t)) if t > 0 else -1.0 + rng.random() * 1e-9, i)
            for i, t in enumerate(totals)
        ]
        return [i for _, i in heapq.nlargest(k, keyed)]
