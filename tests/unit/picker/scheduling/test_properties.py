"""Properties of every policy: subset hint kept, fresh preferred, scores in [0, 1], seed-deterministic."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from epp.errors import EppError
from epp.picker.datastore.types import EndpointState
from epp.picker.scheduling.build import POLICY_NAMES, build_scheduler
from epp.picker.scheduling.framework import record_routed
from epp.picker.scheduling.types import LLMRequest
from tests.unit.picker.scheduling.helpers import BASE, endpoint_state, snapshot_of

NOW = 100.0
METRIC_AWARE = ("default", "least-queue", "gie-v0.3", "gie-v1")

pod_strategy = st.fixed_dictionaries(
    {
        "waiting": st.integers(0, 200),
        "running": st.integers(0, 64),
        "kv": st.floats(0.0, 1.0),
        "max_lora": st.integers(1, 8),
        "active": st.sets(st.sampled_from(["a", "b", "c", "d"]), max_size=4),
        "deferred": st.integers(0, 5),
        "age_s": st.sampled_from([0.0, 0.5, 1.9, 3.0, 60.0]),
        "failures": st.sampled_from([0, 0, 0, 1]),
    }
)


def _states(pods: list[dict[str, object]]) -> list[EndpointState]:
    return [
        endpoint_state(
            i,
            updated_at=NOW - float(p["age_s"]),  # type: ignore[arg-type]
            waiting=p["waiting"],  # type: ignore[arg-type]
            running=p["running"],  # type: ignore[arg-type]
            kv=p["kv"],  # type: ignore[arg-type]
            max_lora=p["max_lora"],  # type: ignore[arg-type]
            active=p["active"],  # type: ignore[arg-type]
            deferred=p["deferred"],  # type: ignore[arg-type]
            scrape_failures=p["failures"],  # type: ignore[arg-type]
        )
        for i, p in enumerate(pods)
    ]


requests = st.lists(st.sampled_from(["a", "b", "c", "d", "e", BASE]), min_size=1, max_size=12)


@pytest.mark.parametrize("policy", POLICY_NAMES, ids=POLICY_NAMES)
@settings(max_examples=40, deadline=None)
@given(
    pods=st.lists(pod_strategy, min_size=1, max_size=8),
    subset_mask=st.lists(st.booleans(), min_size=8, max_size=8),
    models=requests,
)
def test_only_candidates_are_returned_and_fresh_win(
    policy: str, pods: list[dict[str, object]], subset_mask: list[bool], models: list[str]
) -> None:
    states = _states(pods)
    candidates = [s for s, keep in zip(states, subset_mask, strict=False) if keep] or states[:1]
    names = {c.name for c in candidates}
    any_fresh = any(c.is_fresh(NOW, 2.0) for c in candidates)
    scheduler = build_scheduler(policy=policy, seed=5)
    snapshot = snapshot_of(states, NOW)
    for i, model in enumerate(models):
        request = LLMRequest(
            request_id=f"r{i}", incoming_model=model, target_model=model, prompt="p" * (i * 70)
        )
        try:
            result = scheduler.schedule(request, candidates, snapshot, NOW)
        except EppError:
            assert policy == "gie-v0.3"  # the v0.3 tree drops non-critical requests when saturated
            continue
        assert result.endpoints, "a result is never empty"
        assert {e.name for e in result.endpoints} <= names
        assert len({e.name for e in result.endpoints}) == len(result.endpoints)
        if policy in METRIC_AWARE and any_fresh:
            assert all(e.is_fresh(NOW, 2.0) for e in result.endpoints)
        for per_scorer in result.scores.values():
            assert all(0.0 <= s <= 1.0 for s in per_scorer.values())
        record_routed(scheduler, request, result, NOW)


@pytest.mark.parametrize("policy", POLICY_NAMES, ids=POLICY_NAMES)
@settings(max_examples=20, deadline=None)
@given(pods=st.lists(pod_strategy, min_size=2, max_size=8), models=requests)
def test_same_seed_same_decisions(policy: str, pods: list[dict[str, object]], models: list[str]) -> None:
    states = _states(pods)
    snapshot = snapshot_of(states, NOW)

    def decisions(seed: int) -> list[tuple[str, ...]]:
        scheduler = build_scheduler(policy=policy, seed=seed)
        out: list[tuple[str, ...]] = []
        for i, model in enumerate(models):
            request = LLMRequest(
                request_id=f"r{i}", incoming_model=model, target_model=model, prompt="q" * 130
            )
            try:
                result = scheduler.schedule(request, states, snapshot, NOW + i * 0.01)
            except EppError:
                out.append(("dropped",))
                continue
            record_routed(scheduler, request, result, NOW + i * 0.01)
            out.append(tuple(e.name for e in result.endpoints))
        return out

    assert decisions(11) == decisions(11)


def test_default_totals_are_the_weighted_sum_in_unit_range() -> None:
    states = [
        endpoint_state(i, updated_at=NOW, waiting=i * 3, kv=i / 10, active={"a"} if i == 1 else ())
        for i in range(5)
    ]
    scheduler = build_scheduler(seed=1)
    request = LLMRequest(request_id="r", incoming_model="a", target_model="a")
    result = scheduler.schedule(request, states, snapshot_of(states, NOW), NOW)
    weights = {
        "adapter-affinity-scorer": 0.5,
        "kv-cache-match-scorer": 0.2,
        "load-scorer": 0.15,
        "gpu-headroom-scorer": 0.15,
    }
    for name, total in result.total_scores.items():
        assert 0.0 <= total <= 1.0
        assert total == pytest.approx(sum(weights[k] * v for k, v in result.scores[name].items()))
    assert result.primary.name == "pod-1-rank-0"
    assert result.reason == "adapter-active"
    assert len(result.endpoints) == 1  # one endpoint unless fallbacks are configured


def test_stale_only_pool_still_gets_an_endpoint() -> None:
    states = [endpoint_state(i, updated_at=NOW - 30.0) for i in range(3)] + [
        endpoint_state(3, updated_at=None)
    ]
    for policy in POLICY_NAMES:
        if policy == "gie-v0.3":
            continue  # v0.3 sheds non-critical requests when no pod is known to have room
        scheduler = build_scheduler(policy=policy, seed=2)
        request = LLMRequest(request_id="r", incoming_model="a", target_model="a")
        result = scheduler.schedule(request, states, snapshot_of(states, NOW), NOW)
        assert result.primary in states
