"""The placement plan: the same homes in every process, sized by traffic, sticky as pods and traffic move."""

from __future__ import annotations

import os
import subprocess
import sys
from collections import Counter

import pytest

from epp.picker.scheduling.plan import HomePlan
from tests.support import placement

PODS = tuple(f"pod-{i}" for i in range(10))


def test_two_plans_agree_and_so_does_another_process_with_another_hash_seed() -> None:
    here = {a: sorted(HomePlan().plan_homes(a, PODS, 2)) for a in ("sql-lora", "tweet-summary", "a-7")}
    assert here == {a: sorted(HomePlan().plan_homes(a, PODS, 2)) for a in here}
    code = (
        "from epp.picker.scheduling.plan import HomePlan\n"
        f"pods = {PODS!r}\n"
        "print({a: sorted(HomePlan().plan_homes(a, pods, 2)) for a in ('sql-lora', 'tweet-summary', 'a-7')})"
    )
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == repr(here)


def test_rare_adapters_spread_evenly_one_home_each() -> None:
    plan = HomePlan()
    per_pod = Counter(home for a in range(2000) for home in plan.plan_homes(f"adapter-{a}", PODS, 1))
    assert sum(per_pod.values()) == 2000
    assert set(per_pod) == set(PODS)
    assert all(150 <= n <= 250 for n in per_pod.values())  # 200 each, within ±25 % (±3.7 σ)


def test_homes_grow_at_once_and_shrink_only_when_demand_halves() -> None:
    plan = HomePlan()
    first = plan.plan_homes("hot", PODS, 2)
    grown = plan.plan_homes("hot", PODS, 5)
    assert first < grown and len(grown) == 5  # growing keeps the old homes
    assert plan.plan_homes("hot", PODS, 4) == grown  # a small dip keeps all five
    assert plan.plan_homes("hot", PODS, 3) == grown
    shrunk = plan.plan_homes("hot", PODS, 2)
    assert shrunk == first  # at half the demand it shrinks, to the same first homes
    assert len(plan.planned_homes("hot")) == 2


def test_a_pod_leaving_moves_only_the_adapters_it_was_home_to() -> None:
    plan = HomePlan()
    adapters = [f"adapter-{a}" for a in range(300)]
    before = {a: plan.plan_homes(a, PODS, 1) for a in adapters}
    fewer = tuple(p for p in PODS if p != "pod-3")
    after = {a: plan.plan_homes(a, fewer, 1) for a in adapters}
    moved = {a for a in adapters if before[a] != after[a]}
    assert moved == {a for a in adapters if before[a] == {"pod-3"}}
    assert moved  # pod-3 was home to some of them


def test_a_filtered_out_home_hands_its_place_to_the_next_in_rank() -> None:
    plan = HomePlan()
    ranking = placement.ranking("sql-lora", PODS)
    without_first = tuple(p for p in PODS if p != ranking[0])
    assert plan.plan_homes("sql-lora", without_first, 1) == {ranking[1]}
    assert plan.planned_homes("sql-lora") == (ranking[1],)


def test_memory_is_bounded_by_the_adapters_it_remembers() -> None:
    plan = HomePlan(max_adapters=50)
    for a in range(500):
        plan.plan_homes(f"adapter-{a}", PODS, 1)
    assert len(plan) == 50
    assert plan.planned_homes("adapter-0") == () and len(plan.planned_homes("adapter-499")) == 1


@pytest.mark.parametrize(("shrink_at", "max_adapters"), [(0.0, 10), (1.5, 10), (0.5, 0)])
def test_bad_settings_are_refused(shrink_at: float, max_adapters: int) -> None:
    with pytest.raises(ValueError):
        HomePlan(shrink_at=shrink_at, max_adapters=max_adapters)
