"""`SharedScheduler`: what one replica routes, its peers count; resets, silence and bounds."""

from __future__ import annotations

import pytest

from epp.picker.datastore.types import EndpointState
from epp.picker.scheduling.build import build_scheduler_from_config
from epp.picker.scheduling.config import load_config
from epp.picker.scheduling.framework import ProfileScheduler
from epp.picker.scheduling.policies import policy_config_text
from epp.picker.scheduling.shared import PeerBatch, SharedScheduler
from epp.picker.scheduling.types import LLMRequest, SchedulingResult
from tests.unit.scheduling.helpers import endpoint_state, snapshot_of

NOW = 10.0
PODS = [endpoint_state(i, updated_at=NOW, max_lora=2) for i in range(4)]


def replica(seed: int, **options: float) -> SharedScheduler:
    inner = build_scheduler_from_config(load_config(policy_config_text("default")), seed=seed, name="default")
    assert isinstance(inner, ProfileScheduler)
    return SharedScheduler(inner, **options)  # type: ignore[arg-type]


def request(model: str, request_id: str) -> LLMRequest:
    return LLMRequest(request_id=request_id, incoming_model=model, target_model=model)


def route(
    scheduler: SharedScheduler,
    model: str,
    request_id: str,
    pods: list[EndpointState] = PODS,
    now: float = NOW,
) -> SchedulingResult:
    req = request(model, request_id)
    result = scheduler.schedule(req, pods, snapshot_of(pods, now), now)
    scheduler.on_routed(req, result, now)
    return result


def deliver(sender: SharedScheduler, receiver: SharedScheduler, now: float = NOW) -> PeerBatch:
    batch = sender.drain("receiver", "sender", now)
    receiver.apply(batch, now)
    sender.sent("receiver", "receiver-id")
    return batch


def test_a_peers_in_flight_requests_and_loaded_adapter_steer_the_next_decision() -> None:
    a, b = replica(1), replica(2)
    a.set_peers(["receiver"])
    first = route(a, "sql-lora", "r1", [PODS[3]])  # A puts the adapter on pod-3
    for n in range(6):  # and a batch of base-model requests on pod-0
        route(a, "", f"base-{n}", [PODS[0]])
    deliver(a, b)
    assert b.state.inflight.count("pod-0-rank-0") == 6
    assert b.state.inflight.count("pod-3-rank-0") == 1
    # B has routed nothing, yet it sends the adapter where A loaded it, for the reason it is there.
    result = route(b, "sql-lora", "b1")
    assert result.primary.name == first.primary.name == "pod-3-rank-0"
    assert result.reason == "adapter-active"
    # A's requests finish: B stops counting them.
    for n in range(6):
        a.on_completed(request("", f"base-{n}"), "pod-0-rank-0", NOW)
    a.on_completed(request("sql-lora", "r1"), "pod-3-rank-0", NOW)
    batch = deliver(a, b)
    assert not batch.reset and len(batch.finished) == 7
    assert b.state.inflight.count("pod-0-rank-0") == 0
    assert b.state.inflight.count("pod-3-rank-0") == 1  # B's own request


def test_the_first_batch_a_failure_and_a_restarted_peer_each_get_the_whole_in_flight_set() -> None:
    a = replica(1)
    route(a, "sql-lora", "r1")
    a.set_peers(["peer"])  # found after r1 was routed: it must still learn of r1
    first = a.drain("peer", "a", NOW + 0.5)
    assert first.reset and [r.key for r in first.routed] == ["r1"]
    assert first.routed[0].age_s == pytest.approx(0.5)
    a.sent("peer", "peer-1")
    route(a, "sql-lora", "r2")
    assert [r.key for r in a.drain("peer", "a", NOW).routed] == ["r2"]  # then only what is new
    route(a, "sql-lora", "r3")
    a.failed("peer")  # r3's batch was lost
    again = a.drain("peer", "a", NOW)
    assert again.reset and {r.key for r in again.routed} == {"r1", "r2", "r3"}
    a.sent("peer", "peer-1")
    assert not a.drain("peer", "a", NOW).reset
    a.sent("peer", "peer-2")  # the same address answers with a new id: it restarted
    assert a.drain("peer", "a", NOW).reset


def test_a_reset_replaces_what_a_peer_held_and_a_silent_peer_is_forgotten() -> None:
    a, b = replica(1), replica(2, peer_timeout_s=2.0)
    a.set_peers(["receiver"])
    route(a, "", "r1", [PODS[0]])
    route(a, "", "r2", [PODS[0]])
    deliver(a, b)
    a.on_completed(request("", "r1"), "pod-0-rank-0", NOW)
    a.failed("receiver")  # the finish of r1 is lost; the reset says only r2 is left
    assert deliver(a, b).reset
    assert b.state.inflight.count("pod-0-rank-0") == 1
    assert [v.in_flight for v in b.peer_views(NOW)] == [1]
    assert b.expire(NOW + 1.0) == []
    assert b.expire(NOW + 2.5) == ["sender"]  # silent past the timeout: A may be dead
    assert b.state.inflight.count("pod-0-rank-0") == 0 and b.peer_views(NOW) == []


def test_an_overflowing_queue_turns_into_a_reset() -> None:
    a = replica(1, max_queued=3)
    a.set_peers(["peer"])
    a.drain("peer", "a", NOW)
    a.sent("peer", "peer-1")
    for n in range(5):
        route(a, "", f"r{n}", [PODS[0]])
    batch = a.drain("peer", "a", NOW)
    assert batch.reset and len(batch.routed) == 5  # the whole in-flight set, not a partial queue


def test_a_peer_dropped_from_the_list_gets_nothing_and_a_new_one_starts_with_a_reset() -> None:
    a = replica(1)
    a.set_peers(["p1"])
    a.drain("p1", "a", NOW)
    a.set_peers(["p2"])
    assert a.peers() == ["p2"]
    route(a, "", "r1", [PODS[0]])
    assert a.drain("p2", "a", NOW).reset


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ValueError):
        replica(1, peer_timeout_s=0)
