"""`PeerReplicator`: what one replica routes, its peers count; resets, silence, bounds and restarts.

Each replica is a `default` scheduler and a `PeerReplicator` on its routing ledger. Our own
requests reach the ledger through `record_routed` and `ledger.finished` (what the director does);
a peer's reach it through `apply`, `expire` and the resets.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from epp.picker.datastore.types import EndpointState
from epp.picker.scheduling.build import build_scheduler_from_config
from epp.picker.scheduling.framework import ProfileScheduler, record_routed
from epp.picker.scheduling.inflight import Flight
from epp.picker.scheduling.ledger import RoutingLedger
from epp.picker.scheduling.picker_config import load_config
from epp.picker.scheduling.shared import PeerBatch, PeerReplicator, PeerRouted
from epp.picker.scheduling.state import SchedulerState
from epp.picker.scheduling.types import LLMRequest, SchedulingResult
from tests.unit.picker.scheduling.helpers import config_text, endpoint_state, snapshot_of

NOW = 10.0
PODS = [endpoint_state(i, updated_at=NOW, max_lora=2) for i in range(4)]


@dataclass
class Replica:
    """One EPP replica: its scheduler and the replicator on that scheduler's ledger."""

    scheduler: ProfileScheduler
    peers: PeerReplicator

    @property
    def state(self) -> SchedulerState:
        return self.scheduler.state

    @property
    def ledger(self) -> RoutingLedger:
        return self.scheduler.state.ledger


def replica(seed: int, *, peer_timeout_s: float = 5.0, max_queued: int = 50_000) -> Replica:
    inner = build_scheduler_from_config(load_config(config_text("default")), seed=seed, name="default")
    assert isinstance(inner, ProfileScheduler)
    peers = PeerReplicator(inner.state.ledger, peer_timeout_s=peer_timeout_s, max_queued=max_queued)
    assert peers.ledger is inner.state.ledger
    return Replica(inner, peers)


def request(model: str, request_id: str) -> LLMRequest:
    return LLMRequest(request_id=request_id, incoming_model=model, target_model=model)


def route(
    r: Replica,
    model: str,
    request_id: str,
    pods: list[EndpointState] = PODS,
    now: float = NOW,
) -> SchedulingResult:
    """Schedule a request and send it, as the director does."""
    req = request(model, request_id)
    result = r.scheduler.schedule(req, pods, snapshot_of(pods, now), now)
    record_routed(r.scheduler, req, result, now)
    return result


def finish(r: Replica, request_id: str, now: float = NOW) -> None:
    """Our own request `request_id` finished (the director's finisher)."""
    assert r.ledger.finished(request_id, now) is not None


def deliver(sender: Replica, receiver: Replica, now: float = NOW, *, sender_id: str = "sender") -> PeerBatch:
    batch = sender.peers.drain("receiver", sender_id, now)
    receiver.peers.apply(batch, now)
    sender.peers.sent("receiver", "receiver-id")
    return batch


def flights(r: Replica) -> list[Flight]:
    return list(r.state.inflight)


def test_a_peers_in_flight_requests_and_loaded_adapter_steer_the_next_decision() -> None:
    a, b = replica(1), replica(2)
    a.peers.set_peers(["receiver"])
    first = route(a, "sql-lora", "r1", [PODS[3]])  # A puts the adapter on pod-3
    for n in range(6):  # and a batch of base-model requests on pod-0
        route(a, "", f"base-{n}", [PODS[0]])
    deliver(a, b)
    assert b.state.inflight.count("pod-0-rank-0") == 6
    assert b.state.inflight.count("pod-3-rank-0") == 1
    # In B's ledger under the sender's id, as A routed them: the base model needs no slot.
    held = {f.key: f for f in flights(b)}
    assert held["sender/r1"] == Flight("sender/r1", "pod-3-rank-0", "sql-lora", NOW, "sender")
    assert held["sender/base-0"].adapter == "" and held["sender/base-0"].origin == "sender"
    assert b.ledger.own() == []
    # B has routed nothing, yet it sends the adapter where A loaded it, for the reason it is there.
    result = route(b, "sql-lora", "b1")
    assert result.primary.name == first.primary.name == "pod-3-rank-0"
    assert result.reason == "adapter-active"
    assert [f.key for f in b.ledger.own()] == ["b1"]
    # A's requests finish: B stops counting them.
    for n in range(6):
        finish(a, f"base-{n}")
    finish(a, "r1")
    batch = deliver(a, b)
    assert not batch.reset and len(batch.finished) == 7
    assert b.state.inflight.count("pod-0-rank-0") == 0
    assert b.state.inflight.count("pod-3-rank-0") == 1  # B's own request
    assert [f.key for f in flights(b)] == ["b1"]


def test_a_peers_requests_count_as_its_own_routing_would() -> None:
    """In flight, residency and popularity: B, told of A's requests, holds what A holds."""
    a, b = replica(1), replica(2)
    a.peers.set_peers(["receiver"])
    for n in range(3):
        route(a, "sql-lora", f"r{n}", [PODS[1]])
    route(a, "", "base", [PODS[2]])
    deliver(a, b)
    for endpoint in ("pod-1-rank-0", "pod-2-rank-0"):
        assert b.state.inflight.count(endpoint) == a.state.inflight.count(endpoint)
        assert b.state.inflight.adapters(endpoint) == a.state.inflight.adapters(endpoint)
    assert b.state.residency.homes("sql-lora") == a.state.residency.homes("sql-lora") == {"pod-1-rank-0"}
    pod = b.state.residency.pod("pod-1-rank-0")
    assert pod is not None and list(pod.gpu) == ["sql-lora"]
    assert b.state.residency.homes("") == set()  # the base model takes no slot
    assert b.state.popularity.rate("sql-lora", NOW) == pytest.approx(3.0)
    assert b.state.popularity.rate("sql-lora", NOW) == pytest.approx(a.state.popularity.rate("sql-lora", NOW))
    assert b.state.popularity.rate("", NOW) == 0.0


def test_the_first_batch_a_failure_and_a_restarted_peer_each_get_the_whole_in_flight_set() -> None:
    a = replica(1)
    route(a, "sql-lora", "r1")
    a.peers.set_peers(["peer"])  # found after r1 was routed: it must still learn of r1
    first = a.peers.drain("peer", "a", NOW + 0.5)
    assert first.reset and [r.key for r in first.routed] == ["r1"]
    assert first.routed[0].age_s == pytest.approx(0.5)
    a.peers.sent("peer", "peer-1")
    route(a, "sql-lora", "r2")
    assert [r.key for r in a.peers.drain("peer", "a", NOW).routed] == ["r2"]  # then only what is new
    route(a, "sql-lora", "r3")
    a.peers.failed("peer")  # r3's batch was lost
    again = a.peers.drain("peer", "a", NOW)
    assert again.reset and {r.key for r in again.routed} == {"r1", "r2", "r3"}
    a.peers.sent("peer", "peer-1")
    assert not a.peers.drain("peer", "a", NOW).reset
    a.peers.sent("peer", "peer-2")  # the same address answers with a new id: it restarted
    assert a.peers.drain("peer", "a", NOW).reset


def test_a_reset_carries_only_our_own_requests() -> None:
    a, b, c = replica(1), replica(2), replica(3)
    a.peers.set_peers(["receiver"])
    route(a, "", "a1", [PODS[0]])
    deliver(a, c)  # C holds A's request
    route(c, "", "c1", [PODS[1]])
    c.peers.set_peers(["receiver"])
    batch = deliver(c, b, sender_id="c")
    assert batch.reset and [r.key for r in batch.routed] == ["c1"]  # not A's: A tells B itself
    assert [f.key for f in flights(b)] == ["c/c1"]


def test_a_reset_replaces_what_a_peer_held_and_a_silent_peer_is_forgotten() -> None:
    a, b = replica(1), replica(2, peer_timeout_s=2.0)
    a.peers.set_peers(["receiver"])
    route(a, "", "r1", [PODS[0]])
    route(a, "", "r2", [PODS[0]])
    deliver(a, b)
    finish(a, "r1")
    a.peers.failed("receiver")  # the finish of r1 is lost; the reset says only r2 is left
    assert deliver(a, b).reset
    assert b.state.inflight.count("pod-0-rank-0") == 1
    assert [f.key for f in flights(b)] == ["sender/r2"]
    assert [v.in_flight for v in b.peers.peer_views(NOW)] == [1]
    assert b.peers.expire(NOW + 1.0) == []
    assert b.peers.expire(NOW + 2.5) == ["sender"]  # silent past the timeout: A may be dead
    assert b.state.inflight.count("pod-0-rank-0") == 0 and b.peers.peer_views(NOW) == []


def test_a_silent_peers_adapter_stops_holding_its_slot() -> None:
    """An expired peer's requests finish in our ledger: the slot they held can be taken again."""
    a, b = replica(1), replica(2, peer_timeout_s=2.0)
    a.peers.set_peers(["receiver"])
    pods = [endpoint_state(0, updated_at=NOW, max_lora=1)]
    route(a, "x", "r1", pods)
    deliver(a, b)
    assert b.state.adapter_in_flight("pod-0-rank-0", "x")
    route(b, "y", "b1", pods)  # the only slot is busy with A's request: y waits
    pod = b.state.residency.pod("pod-0-rank-0")
    assert pod is not None and list(pod.waiters) == ["y"]
    assert b.peers.expire(NOW + 3.0) == ["sender"]
    assert not b.state.adapter_in_flight("pod-0-rank-0", "x")
    assert list(pod.gpu) == ["y"] and not pod.waiters  # x, idle now, gave its slot to y


def test_a_restarted_sender_is_counted_under_its_new_id_and_its_old_one_expires() -> None:
    a, b = replica(1), replica(2, peer_timeout_s=2.0)
    a.peers.set_peers(["receiver"])
    route(a, "", "r1", [PODS[0]])
    deliver(a, b, sender_id="a-1")
    restarted = replica(1)  # the same replica, a new process: its old requests are gone
    restarted.peers.set_peers(["receiver"])
    route(restarted, "", "r1", [PODS[1]])  # keys restart too, under a new id
    batch = deliver(restarted, b, NOW + 1.0, sender_id="a-2")
    assert batch.reset
    assert {f.key for f in flights(b)} == {"a-1/r1", "a-2/r1"}  # no collision between the two
    assert [(v.sender, v.in_flight) for v in b.peers.peer_views(NOW + 1.0)] == [("a-1", 1), ("a-2", 1)]
    assert b.peers.expire(NOW + 2.5) == ["a-1"]
    assert [f.key for f in flights(b)] == ["a-2/r1"]
    assert b.state.inflight.count("pod-0-rank-0") == 0 and b.state.inflight.count("pod-1-rank-0") == 1


def test_an_overflowing_queue_turns_into_a_reset() -> None:
    a = replica(1, max_queued=3)
    a.peers.set_peers(["peer"])
    a.peers.drain("peer", "a", NOW)
    a.peers.sent("peer", "peer-1")
    for n in range(5):
        route(a, "", f"r{n}", [PODS[0]])
    batch = a.peers.drain("peer", "a", NOW)
    assert batch.reset and len(batch.routed) == 5  # the whole in-flight set, not a partial queue


def test_a_peer_dropped_from_the_list_gets_nothing_and_a_new_one_starts_with_a_reset() -> None:
    a = replica(1)
    a.peers.set_peers(["p1"])
    a.peers.drain("p1", "a", NOW)
    a.peers.set_peers(["p2"])
    assert a.peers.peers() == ["p2"]
    route(a, "", "r1", [PODS[0]])
    assert a.peers.drain("p2", "a", NOW).reset


def test_an_own_request_dropped_at_its_timeout_is_sent_as_finished() -> None:
    """A lost completion: our tracker lets the request go, and the peers stop counting it too."""
    a, b = replica(1), replica(2, peer_timeout_s=1_000.0)
    a.peers.set_peers(["receiver"])
    route(a, "", "r1", [PODS[0]])
    deliver(a, b)
    later = NOW + 601.0  # past the tracker's 600 s request timeout
    route(a, "", "r2", [PODS[1]], now=later)
    assert [f.key for f in flights(a)] == ["r2"]
    batch = deliver(a, b, later)
    assert batch.finished == ("r1",)
    assert [r.key for r in batch.routed] == ["r2"]
    assert [f.key for f in flights(b)] == ["sender/r2"]
    assert [v.in_flight for v in b.peers.peer_views(later)] == [1]


def test_a_peers_request_our_bounds_drop_no_longer_counts_for_that_peer() -> None:
    a, b = replica(1), replica(2, peer_timeout_s=1_000.0)
    a.peers.set_peers(["receiver"])
    route(a, "", "r1", [PODS[0]])
    deliver(a, b)
    later = NOW + 601.0
    route(b, "", "b1", [PODS[1]], now=later)  # B's tracker lets A's old request go
    assert [f.key for f in flights(b)] == ["b1"]
    assert [v.in_flight for v in b.peers.peer_views(later)] == [0]  # the view follows the ledger


def test_a_request_routed_again_moves_at_the_peers_too() -> None:
    """A key routed a second time (a retry elsewhere) moves; within one batch it must not vanish."""
    a, b = replica(1), replica(2)
    a.peers.set_peers(["receiver"])
    route(a, "", "r1", [PODS[0]])
    deliver(a, b)
    route(a, "", "r1", [PODS[1]], now=NOW + 1.0)  # the ledger finishes it on pod-0 and routes it anew
    assert [(f.key, f.endpoint) for f in flights(a)] == [("r1", "pod-1-rank-0")]
    deliver(a, b, NOW + 1.0)
    assert [(f.key, f.endpoint) for f in flights(b)] == [("sender/r1", "pod-1-rank-0")]
    assert [v.in_flight for v in b.peers.peer_views(NOW + 1.0)] == [1]
    # And when it finishes, it is gone everywhere.
    finish(a, "r1", NOW + 2.0)
    deliver(a, b, NOW + 2.0)
    assert flights(b) == []


def test_a_reset_does_not_count_again_what_the_peer_already_holds() -> None:
    """A lost batch makes the next one a reset; the requests it repeats were routed once, not twice.

    Every replica must see the same popularity, or their placement plans drift apart.
    """
    a, b = replica(1), replica(2)
    a.peers.set_peers(["receiver"])
    route(a, "x", "r1", [PODS[0]])
    route(a, "y", "r2", [PODS[0]])
    deliver(a, b)
    route(a, "z", "r3", [PODS[1]])
    a.peers.failed("receiver")
    assert deliver(a, b, NOW + 1.0).reset
    assert sorted(f.key for f in flights(b)) == ["sender/r1", "sender/r2", "sender/r3"]
    for adapter in ("x", "y", "z"):
        assert b.state.popularity.rate(adapter, NOW + 1.0) == pytest.approx(
            a.state.popularity.rate(adapter, NOW + 1.0)
        )
    # Nor does it reorder the slots as if x had just been routed again.
    pod_a, pod_b = a.state.residency.pod("pod-0-rank-0"), b.state.residency.pod("pod-0-rank-0")
    assert pod_a is not None and pod_b is not None
    assert list(pod_b.gpu) == list(pod_a.gpu) == ["x", "y"]


def test_a_reset_may_move_a_request_the_peer_held_elsewhere() -> None:
    a, b = replica(1), replica(2)
    b.peers.apply(PeerBatch("a", True, (PeerRouted("r1", "pod-0-rank-0", "x", 0.0),)), NOW)
    b.peers.apply(PeerBatch("a", True, (PeerRouted("r1", "pod-1-rank-0", "x", 0.0),)), NOW + 1.0)
    assert [(f.key, f.endpoint) for f in flights(b)] == [("a/r1", "pod-1-rank-0")]
    assert a.state.inflight.count("pod-1-rank-0") == 0  # a separate replica, untouched


def test_a_finish_for_a_request_the_peer_never_sent_changes_nothing() -> None:
    b = replica(2)
    route(b, "", "r1", [PODS[0]])
    b.peers.apply(PeerBatch("a", False, (), ("r1", "unknown")), NOW)  # not B's own "r1"
    assert [f.key for f in flights(b)] == ["r1"]
    assert [v.in_flight for v in b.peers.peer_views(NOW)] == [0]


def test_a_peers_back_dated_request_does_not_hide_our_newer_one_from_the_count_since_the_scrape() -> None:
    b = replica(2)
    scraped_at = NOW - 0.05
    route(b, "", "b1", [PODS[0]])  # ours, after the scrape: the scrape does not show it
    # A's batch arrives now: its request was routed before the scrape, which already shows it.
    b.peers.apply(PeerBatch("a", False, (PeerRouted("r1", "pod-0-rank-0", "", 0.1),)), NOW)
    assert b.state.inflight.count("pod-0-rank-0") == 2
    assert b.state.inflight.routed_since("pod-0-rank-0", scraped_at) == 1


def test_bad_settings_are_refused() -> None:
    ledger = replica(1).ledger
    for timeout_s in (0.0, -1.0):
        with pytest.raises(ValueError):
            PeerReplicator(ledger, peer_timeout_s=timeout_s)
    with pytest.raises(ValueError):
        PeerReplicator(ledger, max_queued=0)
