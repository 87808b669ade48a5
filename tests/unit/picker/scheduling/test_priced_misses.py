"""Adapter affinity with its misses priced by learned costs, the load scorer's prefill term, and the
one estimator a scheduler's plugins share."""

from __future__ import annotations

import pytest

from epp.errors import ConfigError
from epp.picker.datastore.types import EndpointState
from epp.picker.scheduling.build import MAX_SCORED_ENDPOINTS, build_scheduler, build_scheduler_from_config
from epp.picker.scheduling.costs import Tier
from epp.picker.scheduling.framework import ProfileScheduler, record_routed
from epp.picker.scheduling.inflight import InflightTracker
from epp.picker.scheduling.picker_config import load_config
from epp.picker.scheduling.scorers.adapter_affinity import AdapterAffinityScorer
from epp.picker.scheduling.scorers.predicted_ttft import PredictedTtftScorer
from epp.picker.scheduling.types import LLMRequest
from tests.unit.picker.scheduling.helpers import config_text, endpoint_state, snapshot_of

NOW = 10.0


def _scheduler(affinity: str = "", load: str = "") -> ProfileScheduler:
    """`default` with parameters for its adapter-affinity and load scorers."""
    text = config_text("default")
    if affinity:
        text = text.replace(
            "- type: adapter-affinity-scorer\n",
            f"- type: adapter-affinity-scorer\n  parameters: {{{affinity}}}\n",
        )
    if load:
        text = text.replace("- type: load-scorer\n", f"- type: load-scorer\n  parameters: {{{load}}}\n")
    return build_scheduler_from_config(
        load_config(text), seed=1, name="default", max_scored_endpoints=MAX_SCORED_ENDPOINTS["default"]
    )


def _pick(
    scheduler: ProfileScheduler, states: list[EndpointState], model: str, i: int, now: float = NOW
) -> str:
    request = LLMRequest(request_id=f"r{i}", incoming_model=model, target_model=model)
    result = scheduler.schedule(request, states, snapshot_of(states, now), now)
    record_routed(scheduler, request, result, now)
    return result.primary.name


def _home_busy_other_idle() -> list[EndpointState]:
    """Pod 0 runs adapter `a` with 6 requests; pod 1 is idle with a free slot."""
    return [
        endpoint_state(0, updated_at=NOW, running=6, active={"a"}, max_lora=2),
        endpoint_state(1, updated_at=NOW, max_lora=2),
    ]


@pytest.mark.parametrize(
    ("affinity", "expected"),
    [
        ("", 0),  # fixed scores: the adapter's home wins over a free slot
        ("priceMisses: true", 0),  # priced, but nothing learned: a load is priced as a storage read
        ("priceMisses: true, storageLoadSeconds: 0.002", 1),  # a load costs a tenth of a hit
    ],
    ids=["fixed", "priced-storage", "priced-cheap"],
)
def test_a_cheap_miss_lets_load_decide(affinity: str, expected: int) -> None:
    scheduler = _scheduler(affinity, "queueScale: 1")
    states = _home_busy_other_idle()
    assert _pick(scheduler, states, "a", 1) == states[expected].name


def test_what_a_miss_took_is_learned_from_the_requests_own_outcomes() -> None:
    """Misses that turned out to cost nothing over a hit (the adapter was in host memory all along)
    bring the price down from the storage prior until the idle pod wins."""
    scheduler = _scheduler("priceMisses: true, priorWeight: 1", "queueScale: 1")
    estimator = scheduler.state.costs
    assert estimator is not None
    states = _home_busy_other_idle()
    assert _pick(scheduler, states, "a", 0) == states[0].name
    idle = states[1].name
    for i in range(20):  # on the idle pod: hits and misses alike took 20 ms
        for key, tier in ((f"m{i}", Tier.STORAGE), (f"h{i}", Tier.HIT)):
            estimator.routed(key, idle, tier, 0.0)
            estimator.finished(key, idle, 0.020)
    costs = estimator.pod(idle)
    assert costs.storage_load_s < 0.5 * costs.hit_s
    assert _pick(scheduler, states, "a", 1) == idle


def test_the_scheduler_learns_once_for_every_plugin_that_prices() -> None:
    """Affinity pricing its misses and the predicted-TTFT scorer read one estimator, fed once."""
    text = config_text("learned-costs").replace(
        "- type: adapter-affinity-scorer\n",
        "- type: adapter-affinity-scorer\n  parameters: {priceMisses: true}\n",
    )
    scheduler = build_scheduler_from_config(load_config(text), seed=1, name="learned-costs")
    scorers = [w.scorer for w in scheduler.profile.scorers]
    (affinity,) = [s for s in scorers if isinstance(s, AdapterAffinityScorer)]
    (predicted,) = [s for s in scorers if isinstance(s, PredictedTtftScorer)]
    assert affinity.costs is predicted.estimator is scheduler.state.costs
    states = [endpoint_state(0, updated_at=NOW)]
    for i in range(5):
        _pick(scheduler, states, "a", i)
        scheduler.state.ledger.finished(f"r{i}", NOW + 1, ttft_s=0.04)
    costs = predicted.estimator.pod(states[0].name)
    assert costs.hits + costs.storage_loads == 5  # each request observed once, not twice


def test_default_prices_nothing_and_learns_nothing() -> None:
    scheduler = build_scheduler(policy="default", seed=1)
    assert isinstance(scheduler, ProfileScheduler)
    assert scheduler.state.costs is None


def test_a_bad_pricing_parameter_is_a_clear_error() -> None:
    with pytest.raises(ConfigError, match="priceMisses"):
        _scheduler("priceMisses: 3")
    with pytest.raises(ConfigError, match="storageLoadSeconds"):
        _scheduler("storageLoadSeconds: 0.002")  # a prior without pricing prices nothing: unknown


@pytest.mark.parametrize(
    ("load", "spaced"), [("prefillWeight: 3", True), ("", False)], ids=["prefill", "off"]
)
def test_a_request_still_in_its_prefill_weighs_on_its_pod(load: str, spaced: bool) -> None:
    """Two idle pods of equal scrape. Each round one request is routed and finishes at once, and
    10 ms later another arrives: with the prefill term it goes to the other pod every time (the
    first is within the pod's idle TTFT, the 50 ms prior); without it the pods tie and either may
    take it."""
    scheduler = _scheduler(load=load)
    states = [endpoint_state(0, updated_at=NOW), endpoint_state(1, updated_at=NOW)]
    repeats = 0
    for k in range(20):
        t = NOW + k  # a second apart: every earlier request is past its window
        first = _pick(scheduler, states, "", 2 * k, now=t)
        scheduler.state.ledger.finished(f"r{2 * k}", t)
        second = _pick(scheduler, states, "", 2 * k + 1, now=t + 0.01)
        scheduler.state.ledger.finished(f"r{2 * k + 1}", t + 0.01)
        repeats += second == first
    assert (repeats == 0) is spaced


def test_priors_are_set_once_for_the_scheduler() -> None:
    """Whichever plugin is built first, the priors one of them sets are the estimator's; two
    different sets are refused."""
    scheduler = _scheduler("priceMisses: true", "prefillWeight: 3, storageLoadSeconds: 0.002")
    assert scheduler.state.costs is not None
    assert scheduler.state.costs.priors.storage_load_s == 0.002
    with pytest.raises(ConfigError, match="different cost priors"):
        _scheduler(
            "priceMisses: true, storageLoadSeconds: 0.5", "prefillWeight: 3, storageLoadSeconds: 0.002"
        )


def test_routed_recently_counts_from_the_newest_and_forgets_past_its_horizon() -> None:
    tracker = InflightTracker()
    tracker.recent_horizon_s = 1.0
    for i, at in enumerate((0.0, 0.5, 0.9, 1.0)):
        tracker.add(f"r{i}", "p", "a", at)
    tracker.remove("r3")  # finished: still counted, it was routed then
    assert tracker.routed_recently("p", 0.9) == 2
    assert tracker.routed_recently("p", 0.0) == 4
    tracker.add("r4", "p", "a", 1.6)  # the entries from before 0.6 leave the horizon
    assert tracker.routed_recently("p", 0.0) == 3
    assert tracker.routed_recently("other", 0.0) == 0


@pytest.mark.parametrize(
    ("share", "expected"), [("", 0), (", pricingSlotShare: 1", 1)], ids=["scarce", "spare"]
)
def test_with_no_slots_to_spare_a_miss_keeps_its_fixed_score(share: str, expected: int) -> None:
    """The cheap miss above, in a pool of 6 slots where 5 adapters have requests in flight through
    this EPP (3 beside `a` on its home, 2 on a third pod): a load on the idle pod would take a slot
    another adapter waits for, so the home holds, unless `pricingSlotShare` allows that many."""
    scheduler = _scheduler(f"priceMisses: true, storageLoadSeconds: 0.002{share}", "queueScale: 1")
    states = [*_home_busy_other_idle(), endpoint_state(2, updated_at=NOW, max_lora=2)]
    for state in states:
        scheduler.state.residency.observe(state)
    for i, adapter in enumerate(("b", "c", "d", "e", "f")):
        scheduler.state.ledger.routed(f"busy-{i}", states[2 if i < 2 else 0].name, adapter, NOW)
    assert (scheduler.state.inflight.adapters_in_flight, scheduler.state.residency.slot_total) == (5, 6)
    assert _pick(scheduler, states, "a", 1) == states[expected].name


def test_adapters_in_flight_counts_distinct_adapters_over_the_pool() -> None:
    tracker = InflightTracker()
    tracker.add("r1", "p", "a", 0.0)
    tracker.add("r2", "q", "a", 0.0)
    tracker.add("r3", "q", "b", 0.0)
    tracker.add("r4", "q", "", 0.0)  # the base model takes no slot
    assert tracker.adapters_in_flight == 2
    tracker.remove("r1")
    assert tracker.adapters_in_flight == 2  # "a" still in flight on q
    tracker.remove("r2")
    tracker.remove("r3")
    assert tracker.adapters_in_flight == 0
