"""What each choice costs: the per-pod estimator learns hit TTFT, queueing and load prices, and the
predicted-TTFT scorer turns them into a pick."""

from __future__ import annotations

import random

import pytest

from epp.picker.datastore.types import EndpointState
from epp.picker.lifecycle import RequestLife
from epp.picker.scheduling.build import MAX_SCORED_ENDPOINTS, build_scheduler, build_scheduler_from_config
from epp.picker.scheduling.costs import CostEstimator, CostPriors, Tier
from epp.picker.scheduling.framework import ProfileScheduler, record_routed
from epp.picker.scheduling.picker_config import load_config
from epp.picker.scheduling.scorers.predicted_ttft import PredictedTtftScorer
from epp.picker.scheduling.types import LLMRequest
from tests.unit.picker.scheduling.helpers import config_text, endpoint_state, snapshot_of

NOW = 10.0
# A pod with these true costs; observations carry ±10 % noise.
HIT_S, PER_LOAD_S, HOST_S, STORAGE_S = 0.030, 0.004, 0.002, 0.300


def _feed(estimator: CostEstimator, n: int, *, seed: int = 7, pod: str = "p") -> None:
    """`n` finished requests on `pod`: a quarter host loads, a quarter storage loads, loads 0–20."""
    rng = random.Random(seed)
    for i in range(n):
        tier = (Tier.HIT, Tier.HIT, Tier.HOST, Tier.STORAGE)[i % 4]
        load = float(rng.randrange(21))
        true = HIT_S + PER_LOAD_S * load + {Tier.HIT: 0.0, Tier.HOST: HOST_S, Tier.STORAGE: STORAGE_S}[tier]
        key = f"k{i}"
        estimator.routed(key, pod, tier, load)
        estimator.finished(key, pod, true * rng.uniform(0.9, 1.1))


def test_cold_start_reads_the_priors() -> None:
    priors = CostPriors()
    costs = CostEstimator(priors).pod("never-seen")
    assert costs.hit_s == priors.hit_s
    assert costs.per_load_s == priors.per_load_s
    assert costs.extra(Tier.HOST) == priors.host_load_s
    assert costs.extra(Tier.STORAGE) == priors.storage_load_s
    assert costs.extra(Tier.HIT) == 0.0
    # Before any observation a storage load outweighs many requests of queue, as the fixed affinity does.
    assert costs.predict(Tier.STORAGE, 0) > costs.predict(Tier.HIT, 50)


def test_converges_to_known_costs_within_400_requests() -> None:
    estimator = CostEstimator()
    _feed(estimator, 400)
    costs = estimator.pod("p")
    assert costs.hit_s == pytest.approx(HIT_S, rel=0.2)
    assert costs.per_load_s == pytest.approx(PER_LOAD_S, rel=0.2)
    assert costs.extra(Tier.STORAGE) == pytest.approx(STORAGE_S, rel=0.2)
    # The host price is small next to the hit TTFT's noise: within 20 % of the hit TTFT, not of itself.
    assert abs(costs.extra(Tier.HOST) - HOST_S) < 0.2 * HIT_S
    assert (costs.hits, costs.host_loads, costs.storage_loads) == (200, 100, 100)


def test_follows_a_change_of_cost() -> None:
    estimator = CostEstimator()
    _feed(estimator, 400)
    for i in range(100):  # storage got ten times cheaper: 100 storage loads at the new price
        estimator.routed(f"s{i}", "p", Tier.STORAGE, 0.0)
        estimator.finished(f"s{i}", "p", HIT_S + STORAGE_S / 10)
    # (1 − alpha)^100 = 0.6 % of the old gap remains.
    assert estimator.pod("p").extra(Tier.STORAGE) == pytest.approx(STORAGE_S / 10, rel=0.1)


def test_a_new_pod_starts_from_the_pool() -> None:
    estimator = CostEstimator()
    _feed(estimator, 400, pod="p")
    fresh = estimator.pod("q")
    assert fresh.extra(Tier.STORAGE) == pytest.approx(STORAGE_S, rel=0.2)
    assert fresh.hit_s == pytest.approx(HIT_S, rel=0.2)


def test_unknown_and_missing_observations_are_ignored() -> None:
    estimator = CostEstimator()
    estimator.routed("k", "p", Tier.STORAGE, 0.0)
    estimator.finished("k", "other-pod", 5.0)  # the key's earlier flight elsewhere (a retry)
    estimator.finished("nobody", "p", 5.0)
    assert estimator.pod("p").storage_loads == 0
    assert len(estimator) == 1
    estimator.finished("k", "p", None)  # finished without a time to first byte
    assert len(estimator) == 0
    assert estimator.pod("p").storage_loads == 0


def test_pending_requests_are_bounded() -> None:
    estimator = CostEstimator(max_pending=3)
    for i in range(10):
        estimator.routed(f"k{i}", "p", Tier.HIT, 0.0)
    assert len(estimator) == 3


def _scheduler(**priors: float) -> tuple[ProfileScheduler, CostEstimator]:
    """`default` with the predicted-TTFT scorer in place of adapter affinity and load: its own pick."""
    text = (
        config_text("default")
        .replace("maxNumOfEndpoints: 1", "maxNumOfEndpoints: 1000")
        .replace("- type: adapter-affinity-scorer\n", "- type: predicted-ttft-scorer\n")
        .replace("- type: load-scorer\n", "")
        .replace("adapter-affinity-scorer, weight: 0.50", "predicted-ttft-scorer, weight: 0.65")
        .replace("  - {pluginRef: load-scorer, weight: 0.15}\n", "")
    )
    assert "load-scorer" not in text and "adapter-affinity" not in text
    params = ", ".join(f"{k}: {v}" for k, v in priors.items())
    if params:
        text = text.replace(
            "- type: predicted-ttft-scorer\n", f"- type: predicted-ttft-scorer\n  parameters: {{{params}}}\n"
        )
    scheduler = build_scheduler_from_config(
        load_config(text), seed=1, name="learned-costs", max_scored_endpoints=MAX_SCORED_ENDPOINTS["default"]
    )
    return scheduler, _estimator(scheduler)


def _estimator(scheduler: ProfileScheduler) -> CostEstimator:
    (scorer,) = [w.scorer for w in scheduler.profile.scorers if isinstance(w.scorer, PredictedTtftScorer)]
    return scorer.estimator


def _pick(scheduler: ProfileScheduler, states: list[EndpointState], model: str, i: int) -> str:
    request = LLMRequest(request_id=f"r{i}", incoming_model=model, target_model=model)
    result = scheduler.schedule(request, states, snapshot_of(states, NOW), NOW)
    record_routed(scheduler, request, result, NOW)
    return result.primary.name


@pytest.mark.parametrize(("storage_s", "expected"), [(0.002, 1), (0.5, 0)], ids=["cheap", "expensive"])
def test_load_or_affinity_wins_by_the_price_of_a_miss(storage_s: float, expected: int) -> None:
    """Pod 0 holds the adapter with 4 requests queued, pod 1 is idle without it: a cheap load goes
    to the idle pod, a dear one waits behind the queue."""
    scheduler, _ = _scheduler(storageLoadSeconds=storage_s, perRequestSeconds=0.01, hitSeconds=0.03)
    states = [endpoint_state(0, updated_at=NOW, waiting=4, active={"a"}), endpoint_state(1, updated_at=NOW)]
    assert _pick(scheduler, states, "a", 1) == states[expected].name


@pytest.mark.parametrize("policy", ["learned-costs"])
def test_requests_feed_the_estimator_through_the_ledger(policy: str) -> None:
    scheduler = build_scheduler(policy=policy, seed=1)
    assert isinstance(scheduler, ProfileScheduler)
    estimator = _estimator(scheduler)
    states = [endpoint_state(0, updated_at=NOW)]
    for i in range(30):
        name = _pick(scheduler, states, "a", i)
        scheduler.state.ledger.finished(f"r{i}", NOW + 1, ttft_s=0.5)
    costs = estimator.pod(name)
    assert costs.storage_loads == 1  # the first request found the adapter nowhere
    assert costs.hits == 29
    assert costs.hit_s > 0.3  # pulled from the 50 ms prior toward the 0.5 s observed
    assert len(estimator) == 0


@pytest.mark.parametrize(("storage_s", "pods_used"), [(0.002, 4), (0.5, 1)], ids=["cheap", "expensive"])
def test_cheap_swaps_spread_an_adapter_expensive_ones_keep_it(storage_s: float, pods_used: int) -> None:
    """24 requests for one adapter over 4 idle pods, none finishing: each adds a request of load to
    its pod. With cheap loads the adapter spreads over every pod; with dear ones it stays on one."""
    scheduler, _ = _scheduler(storageLoadSeconds=storage_s, perRequestSeconds=0.01, hitSeconds=0.03)
    states = [endpoint_state(i, updated_at=NOW - 0.05, max_lora=4) for i in range(4)]
    picks = [_pick(scheduler, states, "a", i) for i in range(24)]
    assert len(set(picks)) == pods_used


def test_the_time_a_request_spent_in_the_epp_is_not_the_pods() -> None:
    """The access log times the first byte from the request's arrival at the gateway; the estimator
    is given the part after dispatch (a queued request's wait is the EPP's, not the pod's)."""
    life = RequestLife(key="k", request_id="r", arrived_at=100.0, finisher=lambda _: None)
    assert life.upstream_ttft_s is None  # not dispatched, nothing known
    life.dispatched_at = 100.4
    assert life.upstream_ttft_s is None  # the data plane gave no time
    life.outcome.ttft_s = 0.5
    assert life.upstream_ttft_s == pytest.approx(0.1)
