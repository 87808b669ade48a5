"""Our adapter-affinity tiers, as a user sees them: which pod the default policy picks and why."""

from __future__ import annotations

import pytest

from epp.picker.datastore.types import EndpointState
from epp.picker.scheduling.build import MAX_SCORED_ENDPOINTS, build_scheduler_from_config
from epp.picker.scheduling.framework import ProfileScheduler, record_routed
from epp.picker.scheduling.picker_config import load_config
from epp.picker.scheduling.types import LLMRequest
from tests.unit.picker.scheduling.helpers import BASE, config_text, endpoint_state, snapshot_of

NOW = 10.0


def _request(model: str, i: int = 0) -> LLMRequest:
    return LLMRequest(request_id=f"r{i}", incoming_model=model, target_model=model)


def _affinity(scheduler: ProfileScheduler, states: list[EndpointState], model: str) -> dict[str, float]:
    result = scheduler.schedule(_request(model, 999), states, snapshot_of(states, NOW), NOW)
    return {n: s["adapter-affinity-scorer"] for n, s in result.scores.items()}


def _default() -> ProfileScheduler:
    """The `default` policy, returning every candidate (so each one's scores can be read)."""
    text = config_text("default").replace("maxNumOfEndpoints: 1", "maxNumOfEndpoints: 1000")
    assert text != config_text("default")
    return build_scheduler_from_config(
        load_config(text), seed=1, name="default", max_scored_endpoints=MAX_SCORED_ENDPOINTS["default"]
    )


def _route(scheduler: ProfileScheduler, states: list[EndpointState], model: str, pod: int, i: int) -> None:
    request = _request(model, i)
    result = scheduler.schedule(request, [states[pod]], snapshot_of(states, NOW), NOW)
    record_routed(scheduler, request, result, NOW)
    assert scheduler.state.ledger.finished(request.request_id, NOW) is not None


@pytest.mark.parametrize(
    ("setup", "expected_reason"),
    [
        ("active-on-0", "adapter-active"),
        ("resident-idle-on-0", "adapter-resident"),
        ("nowhere", "planned-free-slot"),
    ],
    ids=["active", "resident-idle", "planned-free-slot"],
)
def test_tier_order(setup: str, expected_reason: str) -> None:
    scheduler = _default()
    states = [
        endpoint_state(0, updated_at=NOW, active={"a"} if setup == "active-on-0" else ()),
        endpoint_state(1, updated_at=NOW),
    ]
    if setup == "resident-idle-on-0":
        _route(scheduler, states, "a", 0, 1)
    result = scheduler.schedule(_request("a", 5), states, snapshot_of(states, NOW), NOW)
    assert result.reason == expected_reason
    if setup != "nowhere":
        assert result.primary.name == "pod-0-rank-0"
    else:  # resident nowhere: the placement plan's first home takes it
        assert result.primary.name == result.planned_homes[0]


def test_idle_resident_adapter_wins_though_vllm_reports_nothing() -> None:
    scheduler = _default()
    states = [endpoint_state(i, updated_at=NOW) for i in range(4)]
    _route(scheduler, states, "a", 2, 1)
    # The scrape shows no adapter anywhere (idle residents are invisible to vLLM's metric).
    result = scheduler.schedule(_request("a", 2), states, snapshot_of(states, NOW), NOW)
    assert result.primary.name == "pod-2-rank-0"
    assert result.reason == "adapter-resident"


def test_base_model_needs_no_slot_so_load_decides() -> None:
    scheduler = _default()
    states = [
        endpoint_state(0, updated_at=NOW, waiting=9, active={"x", "y"}),
        endpoint_state(1, updated_at=NOW),
    ]
    scores = _affinity(scheduler, states, BASE)
    assert set(scores.values()) == {1.0}
    result = scheduler.schedule(_request(BASE), states, snapshot_of(states, NOW), NOW)
    assert result.primary.name == "pod-1-rank-0"
    assert result.reason == "base-model"


def test_evicting_a_cold_victim_beats_evicting_a_hot_only_home() -> None:
    scheduler = _default()
    states = [endpoint_state(i, updated_at=NOW, max_lora=1) for i in range(2)]
    for i in range(20):
        _route(scheduler, states, "hot", 0, i)  # pod 0: only home of a hot adapter
    _route(scheduler, states, "cold", 1, 100)  # pod 1: a cold adapter
    scores = _affinity(scheduler, states, "rare")
    assert scores["pod-0-rank-0"] == 0.0  # never evict a hotter adapter's only home for a colder one
    assert scores["pod-1-rank-0"] > 0.0
    result = scheduler.schedule(_request("rare", 200), states, snapshot_of(states, NOW), NOW)
    assert result.primary.name == "pod-1-rank-0"


def test_saturated_home_spills_to_a_free_slot() -> None:
    scheduler = _default()
    states = [
        endpoint_state(0, updated_at=NOW, waiting=20, active={"hot"}),
        endpoint_state(1, updated_at=NOW),
    ]
    result = scheduler.schedule(_request("hot"), states, snapshot_of(states, NOW), NOW)
    assert result.primary.name == "pod-1-rank-0"
    assert result.scores["pod-1-rank-0"]["adapter-affinity-scorer"] > 0.4


def test_pod_without_lora_scores_zero_for_adapters() -> None:
    scheduler = _default()
    states = [
        endpoint_state(0, updated_at=NOW, lora_enabled=False),
        endpoint_state(1, updated_at=NOW, waiting=3),
    ]
    result = scheduler.schedule(_request("a"), states, snapshot_of(states, NOW), NOW)
    assert result.primary.name == "pod-1-rank-0"


def test_burst_between_scrapes_spreads_by_inflight() -> None:
    """Many base requests before the next scrape must not all land on one pod."""
    scheduler = _default()
    states = [endpoint_state(i, updated_at=NOW) for i in range(4)]
    picks: dict[str, int] = {}
    for i in range(40):
        request = _request(BASE, i)
        result = scheduler.schedule(request, states, snapshot_of(states, NOW), NOW + 0.01 * i)
        record_routed(scheduler, request, result, NOW + 0.01 * i)
        picks[result.primary.name] = picks.get(result.primary.name, 0) + 1
    assert len(picks) == 4
    assert max(picks.values()) - min(picks.values()) <= 2


def test_large_pool_scores_a_sample_but_always_the_homes() -> None:
    scheduler = _default()
    states = [endpoint_state(i, updated_at=NOW) for i in range(300)]
    _route(scheduler, states, "a", 217, 1)
    subset = states[100:]
    names = {s.name for s in subset}
    for i in range(20):
        result = scheduler.schedule(_request("a", 10 + i), subset, snapshot_of(states, NOW), NOW)
        assert {e.name for e in result.endpoints} <= names
        assert result.primary.name == "pod-217-rank-0"
    other = scheduler.schedule(_request("b", 99), subset, snapshot_of(states, NOW), NOW)
    assert other.primary.name in names


def test_a_subset_of_a_pool_just_above_the_cap_is_sampled_across_all_of_it() -> None:
    """Flow control's gate hands the scheduler part of the pool; the pods scored beyond the
    adapter's homes must be a fresh draw over all of that part, not its first pods every time."""
    cap = MAX_SCORED_ENDPOINTS["default"]
    scheduler = _default()
    states = [endpoint_state(i, updated_at=NOW) for i in range(cap + cap // 2)]
    subset = states[: len(states) - 2]  # the gate kept all but two
    snapshot = snapshot_of(states, NOW)
    seen: set[str] = set()
    for i in range(40):
        result = scheduler.schedule(_request("cold", i), subset, snapshot, NOW)
        scored = {e.name for e in result.endpoints}
        assert len(scored) == cap
        assert scored <= {s.name for s in subset}
        seen |= scored
    assert seen == {s.name for s in subset}


def test_adapter_with_many_homes_is_scored_on_a_capped_sample_with_room_for_other_pods() -> None:
    cap = MAX_SCORED_ENDPOINTS["default"]
    scheduler = _default()
    states = [endpoint_state(i, updated_at=NOW) for i in range(300)]
    home_names = set()
    for pod in range(0, 200, 2):  # 100 homes, more than the cap
        _route(scheduler, states, "hot", pod, 1000 + pod)
        home_names.add(states[pod].name)
    snapshot = snapshot_of(states, NOW)
    others_seen: set[str] = set()
    for i in range(30):
        result = scheduler.schedule(_request("hot", i), states, snapshot, NOW)
        scored = {e.name for e in result.endpoints}
        homes_scored = scored & home_names
        assert len(scored) == cap
        assert len(homes_scored) == cap - cap // 4
        assert result.primary.name in home_names
        others_seen |= scored - home_names
    # The non-home share is a fresh random draw each decision, not a fixed set.
    assert len(others_seen) > 2 * (cap // 4)


def test_running_load_moves_traffic_to_an_idle_pod() -> None:
    """Five busy homes (queue 0, ~70 running: vLLM batches them all) and one empty pod.

    The waiting queue says nothing here; the running batch does. Traffic must reach the
    empty pod rather than pile onto the homes.
    """
    scheduler = _default()
    adapters = [f"a{i}" for i in range(5)]
    states = [
        endpoint_state(i, updated_at=NOW, running=70, max_lora=4, active={adapters[i]}) for i in range(5)
    ] + [endpoint_state(5, updated_at=NOW, max_lora=4)]
    picks: dict[str, int] = {}
    for i in range(10):
        request = _request(adapters[i % 5], i)
        result = scheduler.schedule(request, states, snapshot_of(states, NOW), NOW)
        record_routed(scheduler, request, result, NOW)
        picks[result.primary.name] = picks.get(result.primary.name, 0) + 1
    assert picks.get("pod-5-rank-0", 0) >= 5


@pytest.mark.parametrize(
    ("running", "spills"),
    [(0, False), (12, False), (20, True), (70, True)],
    ids=["equal-load-stays", "busier-by-12-stays", "busier-by-20-spills", "busier-by-70-spills"],
)
def test_hotspot_spill_fires_on_running_load(running: int, spills: bool) -> None:
    scheduler = _default()
    states = [
        endpoint_state(0, updated_at=NOW, running=running, active={"hot"}),
        endpoint_state(1, updated_at=NOW),
    ]
    result = scheduler.schedule(_request("hot"), states, snapshot_of(states, NOW), NOW)
    assert (result.primary.name == "pod-1-rank-0") is spills
    assert (result.scores["pod-0-rank-0"]["adapter-affinity-scorer"] < 1.0) is spills


def _route_open(
    scheduler: ProfileScheduler, states: list[EndpointState], model: str, pod: int, i: int
) -> None:
    """Route request `i` for `model` to `pod` and leave it in flight."""
    request = _request(model, i)
    result = scheduler.schedule(request, [states[pod]], snapshot_of(states, NOW), NOW)
    record_routed(scheduler, request, result, NOW)


@pytest.mark.parametrize(
    "signal", ["our-routing", "scraped-deferred"], ids=["we-sent-a-fifth-adapter", "scrape-shows-deferred"]
)
def test_pod_with_a_slot_waiter_drains_its_lightest_adapter(signal: str) -> None:
    """No starvation: a rare adapter waiting behind busy slot holders gets a slot.

    Pod 0 holds two busy adapters in its two slots (h1 with 3 in flight, h2 with 1). Once a
    request has waited there for a slot past `drainAfterSeconds`, new h2 traffic must go
    elsewhere so h2 finishes and frees its slot; h1, the busier one, keeps its home.
    """
    scheduler = _default()
    deferred = 1 if signal == "scraped-deferred" else 0
    states = [
        endpoint_state(0, updated_at=NOW, max_lora=2, deferred=deferred),
        endpoint_state(1, updated_at=NOW, max_lora=2),
    ]
    for i in range(3):
        _route_open(scheduler, states, "h1", 0, i)
    _route_open(scheduler, states, "h2", 0, 10)
    if signal == "our-routing":
        _route_open(scheduler, states, "rare", 0, 20)  # every slot busy: it waits
    soon = scheduler.schedule(_request("h2", 29), states, snapshot_of(states, NOW), NOW + 0.2)
    assert soon.scores["pod-0-rank-0"]["adapter-affinity-scorer"] == pytest.approx(1.0)  # a short wait
    later = NOW + 1.5  # past drainAfterSeconds (1)
    h2 = scheduler.schedule(_request("h2", 30), states, snapshot_of(states, NOW), later)
    assert h2.scores["pod-0-rank-0"]["adapter-affinity-scorer"] == pytest.approx(0.05)
    assert h2.primary.name == "pod-1-rank-0"
    h1 = scheduler.schedule(_request("h1", 31), states, snapshot_of(states, NOW), later)
    assert h1.scores["pod-0-rank-0"]["adapter-affinity-scorer"] == pytest.approx(1.0)


def test_waiter_gets_the_slot_when_the_drained_adapter_finishes() -> None:
    scheduler = _default()
    states = [endpoint_state(0, updated_at=NOW, max_lora=2), endpoint_state(1, updated_at=NOW, max_lora=2)]
    requests = []
    for i, model in enumerate(["h1", "h2", "rare"]):
        request = _request(model, i)
        result = scheduler.schedule(request, [states[0]], snapshot_of(states, NOW), NOW)
        record_routed(scheduler, request, result, NOW)
        requests.append((request, result))
    residency = scheduler.state.residency
    pod = residency.pod("pod-0-rank-0")
    assert pod is not None and list(pod.waiters) == ["rare"]
    h2_request, h2_result = requests[1]
    flight = scheduler.state.ledger.finished(h2_request.request_id, NOW + 1.0)
    assert flight is not None and (flight.endpoint, flight.adapter) == (h2_result.primary.name, "h2")
    assert list(pod.gpu) == ["h1", "rare"]
    assert not pod.waiters
    h2 = scheduler.schedule(_request("h2", 40), states, snapshot_of(states, NOW), NOW + 1.0)
    assert h2.scores["pod-0-rank-0"]["adapter-affinity-scorer"] < 0.05  # both slots busy now


def test_two_epp_replicas_place_a_new_adapter_on_the_same_pod() -> None:
    """Each replica has its own state and randomness; the placement plan still makes them agree."""
    states = [endpoint_state(i, updated_at=NOW) for i in range(8)]
    for n in range(20):
        picks = set()
        for seed in (1, 2):
            text = config_text("default")
            scheduler = build_scheduler_from_config(load_config(text), seed=seed, name="default")
            result = scheduler.schedule(_request(f"adapter-{n}"), states, snapshot_of(states, NOW), NOW)
            picks.add(result.primary.name)
        assert len(picks) == 1, f"adapter-{n}: {picks}"
