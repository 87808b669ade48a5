"""The flow controller: limits, head-of-line skipping, TTL, client exits, drain, views, settings."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Hashable

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from epp.picker.flowcontrol.controller import FlowController, Placement, Rejection
from epp.picker.flowcontrol.queues import FAIRNESS_POLICIES, ORDERING_POLICIES, QueueItem
from epp.picker.flowcontrol.settings import BandSettings, FlowControlSettings
from tests.unit.picker.flowcontrol.helpers import Req, names, put


def make(
    *,
    band: BandSettings | None = None,
    max_requests: int = 0,
    max_bytes: int = 0,
    request_ttl_s: float = 60.0,
) -> FlowController[Req]:
    return FlowController(
        FlowControlSettings(
            enabled=True,
            default_band=band or BandSettings(),
            max_requests=max_requests,
            max_bytes=max_bytes,
            request_ttl_s=request_ttl_s,
        )
    )


class Placer:
    """A `place` that answers per lane and remembers what it was offered."""

    def __init__(self, outcomes: dict[Hashable, Placement] | None = None) -> None:
        self.outcomes = outcomes or {}
        self.offered: list[str] = []

    def __call__(self, item: QueueItem[Req]) -> Placement:
        self.offered.append(item.payload.name)
        return self.outcomes.get(item.lane, Placement.PLACED)


# -- enqueue and limits -------------------------------------------------------------------------


@pytest.mark.parametrize(("ttl_s", "deadline"), [(5.0, 15.0), (0.0, float("inf"))], ids=["ttl", "no-ttl"])
def test_enqueue_files_the_request_with_its_deadline(ttl_s: float, deadline: float) -> None:
    fc = make()

    item = put(fc, "r", flow="tenant", priority=2, lane="lora-x", size=42, at=10.0, ttl_s=ttl_s)

    assert (item.payload.name, item.fairness_id, item.priority, item.lane) == ("r", "tenant", 2, "lora-x")
    assert (item.size, item.enqueued_at, item.deadline) == (42, 10.0, deadline)
    assert (len(fc), fc.size) == (1, 42)


LIMIT_CASES = [
    # (band, global max requests, global max bytes, [(priority, size)], expected outcome per request)
    pytest.param(
        BandSettings(max_requests=2),
        0,
        0,
        [(0, 1), (0, 1), (0, 1), (1, 1)],
        [None, None, Rejection.BAND_FULL, None],
        id="band-requests",
    ),
    pytest.param(
        BandSettings(max_bytes=100),
        0,
        0,
        [(0, 60), (0, 41), (0, 40), (0, 1), (0, 0), (3, 100)],
        [None, Rejection.BAND_FULL, None, Rejection.BAND_FULL, None, None],
        id="band-bytes",
    ),
    pytest.param(
        BandSettings(max_bytes=10),
        0,
        0,
        [(0, 11)],
        [Rejection.BAND_FULL],
        id="larger-than-a-band",
    ),
    pytest.param(
        BandSettings(max_requests=0, max_bytes=0),
        3,
        0,
        [(0, 1), (1, 1), (2, 1), (3, 1), (0, 1)],
        [None, None, None, Rejection.POOL_FULL, Rejection.POOL_FULL],
        id="global-requests",
    ),
    pytest.param(
        BandSettings(),
        0,
        50,
        [(0, 30), (1, 30), (1, 20), (2, 1)],
        [None, Rejection.POOL_FULL, None, Rejection.POOL_FULL],
        id="global-bytes",
    ),
    pytest.param(
        BandSettings(max_requests=0, max_bytes=0),
        0,
        0,
        [(0, 10**9)] * 3,
        [None] * 3,
        id="unlimited",
    ),
]


@pytest.mark.parametrize(("band", "max_requests", "max_bytes", "requests", "expected"), LIMIT_CASES)
def test_limits_refuse_what_does_not_fit_and_count_only_what_was_filed(
    band: BandSettings,
    max_requests: int,
    max_bytes: int,
    requests: list[tuple[int, int]],
    expected: list[Rejection | None],
) -> None:
    fc = make(band=band, max_requests=max_requests, max_bytes=max_bytes)

    outcomes = []
    for i, (priority, size) in enumerate(requests):
        filed = fc.enqueue(
            Req(f"r{i}"), fairness_id="t", priority=priority, lane="a", size=size, now=0, ttl_s=0
        )
        outcomes.append(filed if isinstance(filed, Rejection) else None)

    assert outcomes == expected
    accepted = [size for (_, size), outcome in zip(requests, outcomes, strict=True) if outcome is None]
    assert (len(fc), fc.size) == (len(accepted), sum(accepted))
    assert sum(view.requests for view in fc.bands(0.0)) == len(accepted)
    assert sum(view.bytes for view in fc.bands(0.0)) == sum(accepted)


@pytest.mark.parametrize("way_out", ["dispatch", "remove", "expire"])
def test_a_request_leaving_makes_room_under_the_limits(way_out: str) -> None:
    fc = make(band=BandSettings(max_requests=2, max_bytes=20), max_bytes=15)
    first = put(fc, "first", size=10, ttl_s=1.0)
    put(fc, "second", size=5, at=0.5)
    late = Req("late")
    assert (
        fc.enqueue(late, fairness_id="t", priority=0, lane="b", size=5, now=1.0, ttl_s=0)
        is Rejection.BAND_FULL
    )

    if way_out == "dispatch":
        fc.dispatch(2.0, lambda item: Placement.PLACED if item is first else Placement.BLOCKED)
    elif way_out == "remove":
        fc.remove(first.payload)
    else:
        fc.expire(2.0)

    filed = fc.enqueue(late, fairness_id="t", priority=0, lane="b", size=5, now=2.0, ttl_s=0)
    assert isinstance(filed, QueueItem)
    assert (len(fc), fc.size) == (2, 10)


# -- dispatch -----------------------------------------------------------------------------------


def test_a_blocked_head_blocks_only_its_own_lane() -> None:
    fc = make()
    for t, (name, lane) in enumerate([("a1", "a"), ("b1", "b"), ("a2", "a"), ("b2", "b"), ("a3", "a")]):
        put(fc, name, lane=lane, at=float(t))
    place = Placer({"a": Placement.BLOCKED})

    result = fc.dispatch(10.0, place)

    # The requests behind a1 are not offered: they could not be placed either.
    assert place.offered == ["a1", "b1", "b2"]
    assert (names(result.placed), names(result.blocked), result.refused) == (["b1", "b2"], ["a1"], [])
    assert sorted(item.payload.name for item in fc.items()) == ["a1", "a2", "a3"]
    assert fc.waiting_in(0, "t", "a") and not fc.waiting_in(0, "t", "b")

    again = Placer()
    assert names(fc.dispatch(11.0, again).placed) == ["a1", "a2", "a3"] == again.offered


def test_a_blocked_lane_in_one_flow_does_not_block_the_same_lane_key_in_another() -> None:
    fc = make(band=BandSettings(fairness="round-robin"))
    put(fc, "x1", flow="X", at=0.0)
    put(fc, "y1", flow="Y", at=1.0)
    put(fc, "y2", flow="Y", at=2.0)

    result = fc.dispatch(5.0, lambda item: Placement.BLOCKED if item.fairness_id == "X" else Placement.PLACED)

    assert (names(result.placed), names(result.blocked)) == (["y1", "y2"], ["x1"])


def test_blocked_heads_are_reported_best_first_across_bands() -> None:
    fc = make()
    put(fc, "low", priority=-1, lane="a", at=0.0)
    put(fc, "high", priority=4, lane="b", at=1.0)
    put(fc, "mid", priority=0, lane="c", at=2.0)
    put(fc, "mid-old", priority=0, lane="d", at=-1.0)

    result = fc.dispatch(5.0, lambda item: Placement.BLOCKED)

    assert names(result.blocked) == ["high", "mid-old", "mid", "low"]
    assert len(fc) == 4


def test_a_refused_request_leaves_the_queue_and_the_next_in_its_lane_is_offered() -> None:
    fc = make()
    for t, name in enumerate(["r1", "r2", "r3"]):
        put(fc, name, size=10, at=float(t))

    result = fc.dispatch(
        5.0, lambda item: Placement.REFUSED if item.payload.name == "r1" else Placement.PLACED
    )

    assert (names(result.refused), names(result.placed), result.blocked) == (["r1"], ["r2", "r3"], [])
    assert (len(fc), fc.size, list(fc.items())) == (0, 0, [])


def test_a_pass_offers_each_request_at_most_once() -> None:
    fc = make(band=BandSettings(fairness="round-robin", ordering="total-wait"))
    for i in range(12):
        put(fc, f"r{i}", flow=f"f{i % 3}", lane=f"l{i % 2}", at=float(i))
    place = Placer()

    fc.dispatch(20.0, place)

    assert sorted(place.offered) == sorted(f"r{i}" for i in range(12))


def test_dispatch_of_an_empty_controller_offers_nothing() -> None:
    fc = make()
    place = Placer()

    result = fc.dispatch(0.0, place)

    assert (result.placed, result.refused, result.blocked, place.offered) == ([], [], [], [])


# -- leaving without dispatch -------------------------------------------------------------------


def test_expire_takes_out_requests_past_their_deadline_soonest_deadline_first() -> None:
    fc = make()
    put(fc, "long", at=0.0, ttl_s=100.0)
    put(fc, "late-short", lane="b", at=5.0, ttl_s=1.0)  # deadline 6
    put(fc, "early-mid", at=1.0, ttl_s=7.0)  # deadline 8
    put(fc, "forever", at=0.0, ttl_s=0.0)
    put(fc, "exactly-now", lane="c", at=2.0, ttl_s=8.0)  # deadline 10

    gone = fc.expire(10.0)

    assert names(gone) == ["late-short", "early-mid", "exactly-now"]
    assert sorted(item.payload.name for item in fc.items()) == ["forever", "long"]
    assert (len(fc), fc.size) == (2, 2)
    assert fc.expire(10.0) == []
    assert not fc.waiting_in(0, "t", "b")
    assert names(fc.dispatch(11.0, Placer()).placed) == ["long", "forever"]


def test_a_dispatched_request_does_not_expire_later() -> None:
    fc = make()
    put(fc, "gone", at=0.0, ttl_s=1.0)
    put(fc, "stays", lane="b", at=0.0, ttl_s=100.0)
    fc.dispatch(0.5, Placer({"b": Placement.BLOCKED}))

    assert fc.expire(5.0) == []
    assert names(list(fc.items())) == ["stays"]


def test_remove_takes_out_a_request_whose_client_left() -> None:
    fc = make()
    items = [put(fc, f"r{i}", size=10 * (i + 1), at=float(i), ttl_s=5.0) for i in range(3)]
    other = put(fc, "other", lane="b", size=7)

    assert fc.remove(items[1].payload) is items[1]  # from the middle of its lane
    assert fc.remove(items[0].payload) is items[0]  # its head
    assert fc.remove(items[0].payload) is None  # already gone
    assert fc.remove(Req("never-queued")) is None
    assert (len(fc), fc.size) == (2, 37)
    assert [(v.requests, v.bytes, v.flows, v.oldest_wait_s) for v in fc.bands(10.0)] == [(2, 37, 1, 10.0)]
    assert names(fc.expire(7.0)) == ["r2"]  # the removed ones do not expire again
    assert fc.remove(other.payload) is other
    assert not fc.waiting_in(0, "t", "a") and not fc.waiting_in(0, "t", "b")
    assert (len(fc), fc.size, fc.dispatch(10.0, Placer()).placed) == (0, 0, [])


def test_remove_of_a_dispatched_request_finds_nothing() -> None:
    fc = make()
    item = put(fc, "r")
    fc.dispatch(1.0, Placer())

    assert fc.remove(item.payload) is None
    assert len(fc) == 0


def test_drain_takes_out_everything_highest_band_first() -> None:
    fc = make()
    put(fc, "low", priority=-2, size=3, ttl_s=5.0)
    put(fc, "high", priority=9, flow="g", size=4)
    put(fc, "mid", priority=0, lane="b", size=5, ttl_s=5.0)
    put(fc, "mid2", priority=0, flow="h", size=6)

    gone = fc.drain()

    assert [item.priority for item in gone] == [9, 0, 0, -2]
    assert sorted(names(gone)) == ["high", "low", "mid", "mid2"]
    assert (len(fc), fc.size, list(fc.items())) == (0, 0, [])
    assert [(v.priority, v.requests, v.bytes, v.flows, v.oldest_wait_s) for v in fc.bands(1.0)] == [
        (9, 0, 0, 0, None),
        (0, 0, 0, 0, None),
        (-2, 0, 0, 0, None),
    ]
    assert fc.expire(100.0) == []
    assert fc.drain() == []


# -- views --------------------------------------------------------------------------------------


def test_band_views_show_each_band_highest_first() -> None:
    fc = make()
    put(fc, "a", priority=0, flow="A", size=10, at=1.0)
    put(fc, "b", priority=0, flow="B", size=20, at=3.0)
    put(fc, "c", priority=0, flow="B", lane="z", size=30, at=2.0)
    put(fc, "d", priority=5, flow="A", size=1, at=4.0)

    views = fc.bands(now=10.0)

    assert [(v.priority, v.requests, v.bytes, v.flows, v.oldest_wait_s) for v in views] == [
        (5, 1, 1, 1, 6.0),
        (0, 3, 60, 2, 9.0),
    ]
    assert sorted(item.payload.name for item in fc.items(0)) == ["a", "b", "c"]
    assert names(list(fc.items(5))) == ["d"]
    assert list(fc.items(7)) == []


def test_waiting_in_says_whether_a_lane_of_a_flow_in_a_band_holds_requests() -> None:
    fc = make()
    put(fc, "r", priority=1, flow="A", lane=("model", "subset"))

    assert fc.waiting_in(1, "A", ("model", "subset"))
    assert not fc.waiting_in(1, "A", ("model", None))
    assert not fc.waiting_in(1, "B", ("model", "subset"))
    assert not fc.waiting_in(0, "A", ("model", "subset"))


# -- settings -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "build",
    [
        pytest.param(lambda: BandSettings(fairness="lifo"), id="unknown-fairness"),
        pytest.param(lambda: BandSettings(ordering="sjf"), id="unknown-ordering"),
        pytest.param(lambda: BandSettings(max_requests=-1), id="negative-band-requests"),
        pytest.param(lambda: BandSettings(max_bytes=-1), id="negative-band-bytes"),
        pytest.param(lambda: BandSettings(default_weight=0.0), id="zero-default-weight"),
        pytest.param(lambda: BandSettings(weights=(("a", 1.0), ("b", -2.0))), id="negative-weight"),
        pytest.param(lambda: FlowControlSettings(request_ttl_s=-1.0), id="negative-ttl"),
        pytest.param(lambda: FlowControlSettings(max_requests=-1), id="negative-global-requests"),
        pytest.param(lambda: FlowControlSettings(max_bytes=-1), id="negative-global-bytes"),
        pytest.param(lambda: FlowControlSettings(drain_after_s=-0.1), id="negative-drain-after"),
    ],
)
def test_settings_refuse_values_that_make_no_sense(build: Callable[[], object]) -> None:
    with pytest.raises(ValueError):
        build()


def test_every_known_policy_is_accepted_and_a_band_falls_back_to_the_default() -> None:
    named = {
        p: BandSettings(fairness=f, ordering=o)
        for p, (f, o) in enumerate(itertools.product(FAIRNESS_POLICIES, ORDERING_POLICIES))
    }
    default = BandSettings(max_requests=7)
    settings_ = FlowControlSettings(default_band=default, bands=named)

    assert [settings_.band(p) for p in named] == list(named.values())
    assert settings_.band(-5) is default


# -- any sequence of operations -----------------------------------------------------------------

PRIORITIES = (3, 0, -1)
FLOWS = ("f1", "f2", "f3")
LANES = ("x", "y")
BAND_MAX_REQUESTS = 5
BAND_MAX_BYTES = 100
MAX_REQUESTS = 12
MAX_BYTES = 150


def _order_key(ordering: str, item: QueueItem[Req]) -> tuple[float, int]:
    return (item.deadline if ordering == "edf" else item.enqueued_at, item.seq)


class QueueMachine(RuleBasedStateMachine):
    """Random enqueue / dispatch / expire / remove / drain against a plain model of what waits."""

    def __init__(self) -> None:
        super().__init__()
        self.now = 100.0  # not 0: enqueue times then count in the lanes' total waits
        self.bands: dict[int, BandSettings] = {}
        self.fc: FlowController[Req] = FlowController(FlowControlSettings())
        self.live: dict[int, QueueItem[Req]] = {}  # id(payload) -> its item
        self.payloads: list[Req] = []  # every payload ever offered, kept alive so ids stay unique
        self.left: set[int] = set()  # ids of payloads that were dispatched, refused, expired or removed

    @initialize(
        policies=st.lists(
            st.tuples(st.sampled_from(FAIRNESS_POLICIES), st.sampled_from(ORDERING_POLICIES)),
            min_size=len(PRIORITIES),
            max_size=len(PRIORITIES),
        )
    )
    def configure(self, policies: list[tuple[str, str]]) -> None:
        self.bands = {
            p: BandSettings(
                fairness=f,
                ordering=o,
                max_requests=BAND_MAX_REQUESTS,
                max_bytes=BAND_MAX_BYTES,
                weights=(("f1", 2.0),),
            )
            for p, (f, o) in zip(PRIORITIES, policies, strict=True)
        }
        self.fc = FlowController(
            FlowControlSettings(
                enabled=True, max_requests=MAX_REQUESTS, max_bytes=MAX_BYTES, bands=self.bands
            )
        )

    def _lane_items(self, priority: int, flow: str, lane: Hashable) -> list[QueueItem[Req]]:
        return [
            i for i in self.live.values() if (i.priority, i.fairness_id, i.lane) == (priority, flow, lane)
        ]

    @rule(
        priority=st.sampled_from(PRIORITIES),
        flow=st.sampled_from(FLOWS),
        lane=st.sampled_from(LANES),
        size=st.integers(0, 30),
        ttl_s=st.sampled_from([0.0, 1.0, 3.0]),
    )
    def enqueue(self, priority: int, flow: str, lane: str, size: int, ttl_s: float) -> None:
        payload = Req(f"r{len(self.payloads)}")
        self.payloads.append(payload)
        band = [i for i in self.live.values() if i.priority == priority]
        band_full = len(band) >= BAND_MAX_REQUESTS or sum(i.size for i in band) + size > BAND_MAX_BYTES
        pool_full = (
            len(self.live) >= MAX_REQUESTS or sum(i.size for i in self.live.values()) + size > MAX_BYTES
        )

        filed = self.fc.enqueue(
            payload, fairness_id=flow, priority=priority, lane=lane, size=size, now=self.now, ttl_s=ttl_s
        )

        if band_full:
            assert filed is Rejection.BAND_FULL
        elif pool_full:
            assert filed is Rejection.POOL_FULL
        else:
            assert isinstance(filed, QueueItem)
            assert filed.payload is payload
            assert filed.deadline == (self.now + ttl_s if ttl_s else float("inf"))
            self.live[id(payload)] = filed

    @rule(dt=st.integers(0, 3))
    def advance(self, dt: int) -> None:
        self.now += dt  # whole seconds: total waits add up exactly

    @rule(outcomes=st.lists(st.sampled_from(list(Placement)), min_size=1, max_size=8))
    def dispatch(self, outcomes: list[Placement]) -> None:
        offered: list[tuple[QueueItem[Req], Placement]] = []
        blocked_lanes: set[tuple[int, str, Hashable]] = set()

        def place(item: QueueItem[Req]) -> Placement:
            key = id(item.payload)
            assert key not in self.left, "offered again after it left"
            assert self.live.get(key) is item
            lane_key = (item.priority, item.fairness_id, item.lane)
            assert lane_key not in blocked_lanes, "offered from a lane blocked earlier in the pass"
            ordering = self.bands[item.priority].ordering
            lane = self._lane_items(*lane_key)
            assert item is min(lane, key=lambda i: _order_key(ordering, i)), "not its lane's head"
            # Strict priority: everything waiting in a higher band is behind a blocked head.
            for other in self.live.values():
                if other.priority > item.priority:
                    assert (other.priority, other.fairness_id, other.lane) in blocked_lanes
            if self.bands[item.priority].fairness == "global-strict":
                ranks = [self._lane_rank(i) for i in self._heads(item.priority, blocked_lanes)]
                assert self._lane_rank(item) == min(ranks), "not the best head of its band"
            outcome = outcomes[len(offered) % len(outcomes)]
            offered.append((item, outcome))
            if outcome is Placement.BLOCKED:
                blocked_lanes.add(lane_key)
            else:
                del self.live[key]
                self.left.add(key)
            return outcome

        result = self.fc.dispatch(self.now, place)

        assert result.placed == [i for i, o in offered if o is Placement.PLACED]
        assert result.refused == [i for i, o in offered if o is Placement.REFUSED]
        assert result.blocked == [i for i, o in offered if o is Placement.BLOCKED]
        # A pass stops only when every lane left is blocked.
        for item in self.live.values():
            assert (item.priority, item.fairness_id, item.lane) in blocked_lanes

    def _heads(self, priority: int, blocked: set[tuple[int, str, Hashable]]) -> list[QueueItem[Req]]:
        """The head of every lane of band `priority` not blocked in this pass."""
        ordering = self.bands[priority].ordering
        lanes: dict[tuple[int, str, Hashable], list[QueueItem[Req]]] = {}
        for i in self.live.values():
            if i.priority == priority:
                lanes.setdefault((i.priority, i.fairness_id, i.lane), []).append(i)
        return [
            min(lane, key=lambda i: _order_key(ordering, i))
            for key, lane in lanes.items()
            if key not in blocked
        ]

    def _lane_rank(self, head: QueueItem[Req]) -> tuple[float, float]:
        """Where the lane that `head` heads stands in a global-strict band (lower goes first)."""
        ordering = self.bands[head.priority].ordering
        if ordering == "total-wait":
            lane = self._lane_items(head.priority, head.fairness_id, head.lane)
            return (-sum(self.now - i.enqueued_at for i in lane), head.seq)
        return _order_key(ordering, head)

    @rule()
    def expire(self) -> None:
        due = sorted(
            (i for i in self.live.values() if i.deadline <= self.now), key=lambda i: (i.deadline, i.seq)
        )

        gone = self.fc.expire(self.now)

        assert gone == due
        for item in gone:
            del self.live[id(item.payload)]
            self.left.add(id(item.payload))

    @precondition(lambda self: bool(self.payloads))
    @rule(pick=st.integers(0, 10_000))
    def remove(self, pick: int) -> None:
        payload = self.payloads[pick % len(self.payloads)]
        expected = self.live.pop(id(payload), None)

        assert self.fc.remove(payload) is expected
        if expected is not None:
            self.left.add(id(payload))

    # Now and then (every seventh payload), so that most runs build up a backlog first.
    @precondition(lambda self: len(self.payloads) % 7 == 6)
    @rule()
    def drain(self) -> None:
        gone = self.fc.drain()

        assert sorted(map(id, gone)) == sorted(id(i) for i in self.live.values())
        assert [i.priority for i in gone] == sorted((i.priority for i in gone), reverse=True)
        self.left.update(self.live)
        self.live.clear()

    @invariant()
    def counts_views_and_items_agree(self) -> None:
        fc, live = self.fc, list(self.live.values())
        assert len(fc) == len(live)
        assert fc.size == sum(i.size for i in live)
        assert {id(i.payload) for i in fc.items()} == set(self.live)
        views = fc.bands(self.now)
        assert [v.priority for v in views] == sorted((v.priority for v in views), reverse=True)
        by_priority = {v.priority: v for v in views}
        for priority in PRIORITIES:
            band = [i for i in live if i.priority == priority]
            assert {id(i.payload) for i in fc.items(priority)} == {id(i.payload) for i in band}
            view = by_priority.get(priority)
            if view is None:
                assert not band
                continue
            assert (view.requests, view.bytes, view.flows) == (
                len(band),
                sum(i.size for i in band),
                len({i.fairness_id for i in band}),
            )
            assert view.oldest_wait_s == (self.now - min(i.enqueued_at for i in band) if band else None)
        for priority, flow, lane in itertools.product(PRIORITIES, FLOWS, LANES):
            assert fc.waiting_in(priority, flow, lane) == bool(self._lane_items(priority, flow, lane))


TestAnySequenceKeepsTheQueuesConsistent = QueueMachine.TestCase
TestAnySequenceKeepsTheQueuesConsistent.settings = settings(
    max_examples=100, stateful_step_count=40, deadline=None
)
