"""The routing ledger is the only writer of in-flight counts, residency-on-route and popularity.

Our own routing (`record_routed`), a peer's batch, a peer's reset, a peer gone silent and a flight
the in-flight bounds let go all change that state through `routed` and `finished`, and so all
change it the same way; every listener hears each change once, with the flight's origin.
"""

from __future__ import annotations

import pytest

from epp.picker.scheduling.build import POLICY_NAMES, build_scheduler
from epp.picker.scheduling.framework import record_routed
from epp.picker.scheduling.inflight import Flight, InflightTracker
from epp.picker.scheduling.ledger import BASE_MODEL, LedgerListener, RoutingLedger
from epp.picker.scheduling.popularity import AdapterPopularity
from epp.picker.scheduling.residency import ResidencyModel, ResidencyParams
from epp.picker.scheduling.shared import PeerBatch, PeerReplicator, PeerRouted
from epp.picker.scheduling.types import LLMRequest
from tests.unit.picker.scheduling.helpers import BASE, endpoint_state, snapshot_of

POD = "pod-0-rank-0"
OTHER = "pod-1-rank-0"
PEER = "peer"
PODS = [endpoint_state(i, updated_at=0.0) for i in range(2)]

# (key, origin, finished, now) for every change a listener hears
Event = tuple[str, str, bool, float]


class Replica:
    """A ledger with two LoRA slots per pod, a replicator on it and a listener that notes every change."""

    def __init__(self, *, request_timeout_s: float = 10.0, max_tracked: int = 1000) -> None:
        inflight = InflightTracker(request_timeout_s=request_timeout_s, max_tracked=max_tracked)
        residency = ResidencyModel(inflight, ResidencyParams(default_max_lora=2))
        self.ledger = RoutingLedger(inflight, residency, AdapterPopularity())
        self.peers = PeerReplicator(self.ledger, peer_timeout_s=5.0)
        self.events: list[Event] = []
        self.ledger.listen(lambda f, finished, now: self.events.append((f.key, f.origin, finished, now)))

    def send(self, origin: str, key: str, adapter: str, at: float, endpoint: str = POD) -> str:
        """Record `key` routed at `at`, by us (origin "") or by the peer; returns its key in our ledger."""
        if not origin:
            self.ledger.routed(key, endpoint, adapter, at)
            return key
        self.peers.apply(PeerBatch(origin, False, (PeerRouted(key, endpoint, adapter, 0.0),)), at)
        return f"{origin}/{key}"

    def finishes(self) -> list[Event]:
        return [e for e in self.events if e[2]]

    def gpu(self, endpoint: str = POD) -> list[str]:
        pod = self.ledger.residency.pod(endpoint)
        assert pod is not None
        return list(pod.gpu)

    def waiters(self, endpoint: str = POD) -> list[str]:
        pod = self.ledger.residency.pod(endpoint)
        assert pod is not None
        return list(pod.waiters)


@pytest.mark.parametrize("origin", ["", PEER], ids=["our-routing", "a-peer-batch"])
def test_a_routed_flight_changes_in_flight_residency_and_popularity(origin: str) -> None:
    r = Replica()
    keys = [r.send(origin, "k1", "x", 1.0), r.send(origin, "k2", "x", 2.0), r.send(origin, "k3", "", 3.0)]
    ledger = r.ledger
    assert ledger.inflight.count(POD) == len(ledger) == 3
    assert ledger.inflight.adapters(POD) == {"x": 2, BASE_MODEL: 1}
    assert r.gpu() == ["x"] and ledger.residency.homes("x") == {POD}  # the base model takes no slot
    assert ledger.popularity.rate("x", 3.0) == pytest.approx(_rate_after("x", [1.0, 2.0], 3.0))
    assert ledger.popularity.rate(BASE_MODEL, 3.0) == 0.0
    assert [f.origin for f in ledger.inflight] == [origin] * 3
    assert [f.key for f in ledger.own()] == ([] if origin else keys)
    assert r.events == [
        (keys[0], origin, False, 1.0),
        (keys[1], origin, False, 2.0),
        (keys[2], origin, False, 3.0),
    ]


def _rate_after(adapter: str, routed_at: list[float], now: float) -> float:
    """What a popularity told of one request for `adapter` at each of `routed_at` says at `now`."""
    popularity = AdapterPopularity()
    for at in routed_at:
        popularity.record(adapter, at)
    return popularity.rate(adapter, now)


def test_a_reset_records_a_new_flight_as_routing_does_and_finishes_what_it_leaves_out() -> None:
    routed, reset = Replica(), Replica()
    routed.send(PEER, "k1", "x", 1.0)
    routed.send(PEER, "k2", "y", 1.0)
    reset.send(PEER, "k0", "z", 0.5)  # held from the peer, and gone from its reset
    reset.peers.apply(
        PeerBatch(PEER, True, (PeerRouted("k1", POD, "x", 0.0), PeerRouted("k2", POD, "y", 0.0))), 1.0
    )
    assert [(f.key, f.endpoint, f.adapter, f.origin) for f in reset.ledger.inflight] == [
        (f.key, f.endpoint, f.adapter, f.origin) for f in routed.ledger.inflight
    ]
    for adapter in ("x", "y"):
        assert reset.ledger.popularity.rate(adapter, 1.0) == routed.ledger.popularity.rate(adapter, 1.0)
        assert reset.ledger.residency.homes(adapter) == {POD}
    assert reset.gpu() == ["x", "y"]  # z, idle once its request finished, was evicted for y
    assert reset.events == [
        ("peer/k0", PEER, False, 0.5),
        ("peer/k0", PEER, True, 1.0),
        ("peer/k1", PEER, False, 1.0),
        ("peer/k2", PEER, False, 1.0),
    ]


def _end(r: Replica, origin: str, key: str, how: str) -> float:
    """End the flight `key` (h2's, routed at 0) the way `how` says; returns when."""
    if how == "finished":
        assert r.ledger.finished(key, 6.0) is not None
        return 6.0
    if how == "timeout":  # the next route past its timeout lets it go
        r.ledger.routed("later", OTHER, BASE_MODEL, 10.5)
        return 10.5
    if how == "bound":  # the next route past `max_tracked` lets the oldest go
        r.ledger.routed("later", OTHER, BASE_MODEL, 6.0)
        return 6.0
    if how == "peer-finished":
        r.peers.apply(PeerBatch(origin, False, (), (key.split("/", 1)[1],)), 6.0)
        return 6.0
    if how == "peer-reset":
        r.peers.apply(PeerBatch(origin, True, ()), 6.0)
        return 6.0
    assert how == "peer-expired"
    assert r.peers.expire(6.0) == [origin]  # last heard at 0, 5 s before
    return 6.0


@pytest.mark.parametrize(
    ("origin", "how"),
    [
        ("", "finished"),
        ("", "timeout"),
        ("", "bound"),
        (PEER, "peer-finished"),
        (PEER, "peer-reset"),
        (PEER, "peer-expired"),
        (PEER, "timeout"),
        (PEER, "bound"),
    ],
    ids=[
        "ours-finished",
        "ours-dropped-at-timeout",
        "ours-dropped-at-bound",
        "peer-finished",
        "peer-reset-without-it",
        "peer-silent",
        "peers-dropped-at-timeout",
        "peers-dropped-at-bound",
    ],
)
def test_every_way_a_flight_ends_frees_it_the_same_way(origin: str, how: str) -> None:
    """Pod 0 has two slots, held by h2 and h1 in flight; `rare` waits for one. h2's request ends."""
    r = Replica(max_tracked=3 if how == "bound" else 1000)
    h2 = r.send(origin, "k2", "h2", 0.0)
    r.send("", "k1", "h1", 5.0)
    r.send("", "k3", "rare", 5.0)
    assert r.gpu() == ["h2", "h1", "rare"] and r.waiters() == ["rare"]
    popularity = r.ledger.popularity.rate("h2", 5.0)
    at = _end(r, origin, h2, how)
    assert r.ledger.inflight.get(h2) is None
    assert r.ledger.inflight.count(POD) == 2 and r.ledger.inflight.adapter_count(POD, "h2") == 0
    assert r.gpu() == ["h1", "rare"] and r.waiters() == []  # the waiter took h2's slot
    assert r.ledger.residency.homes("h2") == set()
    assert r.ledger.popularity.rate("h2", 5.0) == popularity  # ending a request is not routing one
    assert r.finishes() == [(h2, origin, True, at)]  # heard once, with who routed it
    # The peer that sent it holds nothing more here (a silent one is forgotten altogether).
    assert [v.in_flight for v in r.peers.peer_views(at)] == (
        [] if not origin or how == "peer-expired" else [0]
    )
    # Once ended, it ends no more: a late finish for it changes nothing and tells no one.
    assert r.ledger.finished(h2, at + 1.0) is None
    assert r.finishes() == [(h2, origin, True, at)]


def test_a_flight_dropped_at_its_timeout_is_reported_as_finished_before_the_next_one_is_routed() -> None:
    r = Replica(request_timeout_s=10.0)
    r.send("", "lost", "x", 0.0)  # its completion never comes
    r.send("", "next", "y", 11.0)
    assert r.events == [
        ("lost", "", False, 0.0),
        ("lost", "", True, 11.0),
        ("next", "", False, 11.0),
    ]
    assert [f.key for f in r.ledger.inflight] == ["next"]
    assert not r.ledger.inflight.adapter_count(POD, "x")


def test_a_request_routed_again_moves_and_is_heard_as_finished_there_then_routed_anew() -> None:
    r = Replica()
    r.send("", "k", "x", 1.0)
    r.send("", "k", "x", 2.0, endpoint=OTHER)
    assert [(f.key, f.endpoint) for f in r.ledger.inflight] == [("k", OTHER)]
    assert r.ledger.inflight.count(POD) == 0
    assert r.events == [("k", "", False, 1.0), ("k", "", True, 2.0), ("k", "", False, 2.0)]
    assert r.ledger.residency.homes("x") == {POD, OTHER}  # x stays loaded on pod 0, idle


def test_every_listener_hears_every_change_once_in_the_order_they_listened() -> None:
    r = Replica()
    heard: list[tuple[str, str, bool]] = []

    def listener(name: str) -> LedgerListener:
        return lambda flight, finished, now: heard.append((name, flight.key, finished))

    r.ledger.listen(listener("first"))
    r.ledger.listen(listener("second"))
    r.send("", "k", "x", 1.0)
    assert r.ledger.finished("k", 2.0) == Flight("k", POD, "x", 1.0)
    assert r.ledger.finished("k", 3.0) is None
    assert heard == [
        ("first", "k", False),
        ("second", "k", False),
        ("first", "k", True),
        ("second", "k", True),
    ]


def _request(model: str, key: str = "key-1") -> LLMRequest:
    return LLMRequest(request_id=key, incoming_model=model, target_model=model)


@pytest.mark.parametrize("policy", POLICY_NAMES, ids=POLICY_NAMES)
def test_every_policy_counts_what_it_routes_through_the_ledger(policy: str) -> None:
    scheduler = build_scheduler(policy=policy, seed=1)
    state = scheduler.state
    heard: list[tuple[Flight, bool]] = []
    state.ledger.listen(lambda f, finished, now: heard.append((f, finished)))
    request = _request("x")
    result = scheduler.schedule(request, PODS, snapshot_of(PODS, 0.0), 0.0)
    # Learning the pick writes nothing the ledger keeps: the ledger is the only writer.
    scheduler.on_routed(request, result, 0.0)
    assert len(state.inflight) == 0 and state.popularity.rate("x", 0.0) == 0.0
    assert state.residency.homes("x") == set()
    record_routed(scheduler, request, result, 0.0)
    flight = Flight("key-1", result.primary.name, "x", 0.0)
    assert list(state.inflight) == [flight] and heard == [(flight, False)]
    assert state.residency.homes("x") == {result.primary.name}
    assert state.popularity.rate("x", 0.0) == pytest.approx(1.0)
    assert state.ledger.finished("key-1", 1.0) == flight
    assert len(state.inflight) == 0 and heard == [(flight, False), (flight, True)]


@pytest.mark.parametrize("model", [BASE, ""], ids=["served-base-model", "no-model"])
def test_a_base_model_request_is_in_flight_under_no_adapter(model: str) -> None:
    scheduler = build_scheduler(seed=1)
    state = scheduler.state
    request = _request(model)
    result = scheduler.schedule(request, PODS, snapshot_of(PODS, 0.0), 0.0)
    assert result.reason == "base-model"
    record_routed(scheduler, request, result, 0.0)
    assert list(state.inflight) == [Flight("key-1", result.primary.name, BASE_MODEL, 0.0)]
    assert state.inflight.adapters(result.primary.name) == {BASE_MODEL: 1}
    assert len(state.popularity) == 0 and state.residency.homes(model) == set()


def test_the_scheduler_state_routes_through_one_ledger_over_its_own_parts() -> None:
    state = build_scheduler(seed=1).state
    ledger = state.ledger
    assert (ledger.inflight, ledger.residency, ledger.popularity) == (
        state.inflight,
        state.residency,
        state.popularity,
    )
    assert state.inflight.on_drop is not None  # the tracker's drops reach the ledger's listeners
