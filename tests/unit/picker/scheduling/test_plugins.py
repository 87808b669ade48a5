"""Upstream plugin formulas (scorers, filters, pickers) on hand-built pools."""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass

import pytest

from epp.picker.datastore.types import EndpointState
from epp.picker.scheduling.filters import (
    HeaderBasedTestingFilter,
    LeastKvCacheFilter,
    LeastQueueFilter,
    LoraAffinityFilter,
    LowQueueFilter,
)
from epp.picker.scheduling.framework import Profile, ScheduleContext, WeightedScorer
from epp.picker.scheduling.pickers import MaxScorePicker, RandomPicker, WeightedRandomPicker
from epp.picker.scheduling.scorers.kv_cache_utilization import KvCacheUtilizationScorer
from epp.picker.scheduling.scorers.lora_affinity import LoraAffinityScorer
from epp.picker.scheduling.scorers.queue import QueueScorer
from epp.picker.scheduling.state import SchedulerState
from epp.picker.scheduling.types import LLMRequest
from tests.unit.picker.scheduling.helpers import endpoint_state, snapshot_of


def _ctx(model: str = "a", headers: dict[str, str] | None = None, seed: int = 1) -> ScheduleContext:
    request = LLMRequest(request_id="r", incoming_model=model, target_model=model, headers=headers or {})
    return ScheduleContext(
        request=request,
        snapshot=snapshot_of([]),
        now=0.0,
        state=SchedulerState.create(seed=seed, staleness_threshold_s=2.0),
    )


@pytest.mark.parametrize(
    ("queues", "expected"),
    [([0, 5, 10], [1.0, 0.5, 0.0]), ([3, 3], [1.0, 1.0]), ([2], [1.0])],
    ids=["spread", "all-equal", "single"],
)
def test_queue_scorer(queues: list[int], expected: list[float]) -> None:
    pods = [endpoint_state(i, waiting=q) for i, q in enumerate(queues)]
    assert QueueScorer().score(_ctx(), pods) == pytest.approx(expected)


def test_kv_scorer() -> None:
    pods = [endpoint_state(0, kv=0.25), endpoint_state(1, kv=1.0), endpoint_state(2, updated_at=None)]
    assert KvCacheUtilizationScorer().score(_ctx(), pods) == pytest.approx([0.75, 0.0, 1.0])


@pytest.mark.parametrize(
    ("active", "max_lora", "expected"),
    [({"a"}, 2, 1.0), (set(), 2, 0.8), ({"b"}, 2, 0.0), ({"b"}, 3, 0.8), ({"b", "c"}, 2, 0.0)],
    ids=["active", "empty-has-room", "double-counted-full", "room-with-one", "full"],
)
def test_gie_lora_affinity_tiers(active: set[str], max_lora: int, expected: float) -> None:
    pods = [endpoint_state(0, active=active, max_lora=max_lora)]
    assert LoraAffinityScorer().score(_ctx("a"), pods) == [expected]


def _names(pods: list[EndpointState]) -> list[int]:
    return [int(p.name.split("-")[1]) for p in pods]


def test_decision_tree_filters() -> None:
    pods = [
        endpoint_state(i, waiting=q, kv=kv)
        for i, (q, kv) in enumerate([(0, 0.9), (1, 0.1), (9, 0.0), (200, 0.2)])
    ]
    ctx = _ctx()
    assert _names(LowQueueFilter(threshold=128).filter(ctx, pods)) == [0, 1, 2]
    assert _names(LeastQueueFilter().filter(ctx, pods)) == [0, 1, 2]  # min + (200 − 0) // 4 = 50
    assert _names(LeastKvCacheFilter().filter(ctx, pods)) == [1, 2, 3]  # ≤ 0 + 0.9 / 4


def test_lora_affinity_filter_prefers_affinity() -> None:
    pods = [endpoint_state(0, active={"a"}), endpoint_state(1), endpoint_state(2, active={"x", "y"})]
    picks = [tuple(_names(LoraAffinityFilter().filter(_ctx(seed=s), pods))) for s in range(200)]
    assert picks.count((0,)) >= 190
    assert set(picks) <= {(0,), (1,)}


def test_header_based_testing_filter_keeps_header_order() -> None:
    pods = [endpoint_state(i) for i in range(3)]
    ctx = _ctx(headers={"test-epp-endpoint-selection": "127.0.0.3, 127.0.0.1,10.9.9.9"})
    assert _names(HeaderBasedTestingFilter().filter(ctx, pods)) == [2, 0]
    assert HeaderBasedTestingFilter().filter(_ctx(), pods) == []


def test_max_score_picker_orders_and_breaks_ties_randomly() -> None:
    pods = [endpoint_state(i) for i in range(4)]
    totals = [0.5, 0.9, 0.9, 0.1]
    firsts = {MaxScorePicker(max_endpoints=3).pick(_ctx(seed=s), pods, totals)[0] for s in range(30)}
    assert firsts == {1, 2}
    assert sorted(MaxScorePicker(max_endpoints=3).pick(_ctx(), pods, totals)) == [0, 1, 2]
    assert len(MaxScorePicker(max_endpoints=9).pick(_ctx(), pods, totals)) == 4


def test_random_pickers() -> None:
    pods = [endpoint_state(i) for i in range(5)]
    picked = RandomPicker(max_endpoints=3).pick(_ctx(), pods, [0.0] * 5)
    assert len(set(picked)) == 3
    rng = random.Random(0)
    counts = [0] * 5
    for s in range(400):
        counts[
            WeightedRandomPicker().pick(_ctx(seed=rng.randrange(10**9) + s), pods, [0.0, 0.0, 1.0, 0.0, 3.0])[
                0
            ]
        ] += 1
    assert counts[0] == counts[1] == counts[3] == 0
    assert counts[4] > counts[2] > 0


@dataclass(frozen=True, slots=True)
class _FixedScorer:
    values: tuple[float, ...]
    name: str = "fixed"

    def score(self, ctx: ScheduleContext, endpoints: Sequence[EndpointState]) -> list[float]:
        return list(self.values)


def test_profile_clamps_out_of_range_scores_so_no_scorer_outweighs_the_rest() -> None:
    states = [endpoint_state(i) for i in range(4)]
    profile = Profile(
        name="p",
        filters=(),
        scorers=(WeightedScorer(_FixedScorer((-3.0, 7.0, math.nan, 0.25)), 2.0),),
        picker=MaxScorePicker(max_endpoints=4),
    )
    result = profile.run(_ctx(), states)
    assert result.total_scores == {
        "pod-1-rank-0": 2.0,
        "pod-3-rank-0": 0.5,
        "pod-0-rank-0": 0.0,
        "pod-2-rank-0": 0.0,
    }
    assert result.primary.name == "pod-1-rank-0"


def test_profile_rejects_a_scorer_that_skips_endpoints() -> None:
    profile = Profile(
        name="p", filters=(), scorers=(WeightedScorer(_FixedScorer((1.0,)), 1.0),), picker=MaxScorePicker()
    )
    with pytest.raises(ValueError, match="fixed"):
        profile.run(_ctx(), [endpoint_state(0), endpoint_state(1)])
