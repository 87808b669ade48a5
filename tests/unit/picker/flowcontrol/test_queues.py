"""Queue policies as a dispatch pass shows them: bands by priority, fairness across flows, ordering."""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Hashable, Sequence

import pytest

from epp.picker.flowcontrol.controller import FlowController, Placement
from epp.picker.flowcontrol.queues import (
    FAIRNESS_POLICIES,
    ORDERING_POLICIES,
    TOTAL_WAIT_AGE_CAP_S,
    QueueItem,
)
from epp.picker.flowcontrol.settings import BandSettings, FlowControlSettings
from tests.unit.picker.flowcontrol.helpers import Req, names, put


def make(
    band: BandSettings | None = None, bands: dict[int, BandSettings] | None = None
) -> FlowController[Req]:
    settings = FlowControlSettings(enabled=True, default_band=band or BandSettings(), bands=bands or {})
    return FlowController(settings)


def run_pass(
    fc: FlowController[Req],
    now: float,
    *,
    budget: int | None = None,
    blocked_lanes: Collection[Hashable] = (),
) -> list[QueueItem[Req]]:
    """One dispatch pass that places up to `budget` requests, none from `blocked_lanes`; what it placed."""
    placed: list[QueueItem[Req]] = []

    def place(item: QueueItem[Req]) -> Placement:
        if item.lane in blocked_lanes or (budget is not None and len(placed) >= budget):
            return Placement.BLOCKED
        placed.append(item)
        return Placement.PLACED

    result = fc.dispatch(now, place)
    assert result.placed == placed
    return placed


def flows_of(items: Sequence[QueueItem[Req]]) -> list[str]:
    return [item.fairness_id for item in items]


def one_at_a_time(fc: FlowController[Req], now: float, passes: int) -> list[QueueItem[Req]]:
    """`passes` dispatch passes of one request each (a slot freeing at a time)."""
    placed: list[QueueItem[Req]] = []
    for _ in range(passes):
        placed += run_pass(fc, now, budget=1)
    return placed


POLICIES = [(f, o) for f in FAIRNESS_POLICIES for o in ORDERING_POLICIES]


# -- bands --------------------------------------------------------------------------------------


@pytest.mark.parametrize(("fairness", "ordering"), POLICIES, ids=[f"{f}-{o}" for f, o in POLICIES])
def test_a_higher_band_is_served_before_any_lower_one(fairness: str, ordering: str) -> None:
    fc = make(BandSettings(fairness=fairness, ordering=ordering))
    # Lower bands arrive first and wait longer, in more flows: priority still wins outright.
    for i in range(4):
        put(fc, f"low{i}", priority=-1, flow=f"f{i}", lane=f"l{i}", at=float(i), ttl_s=5.0)
        put(fc, f"mid{i}", priority=0, flow=f"f{i}", lane=f"l{i}", at=10.0 + i, ttl_s=50.0)
    for i in range(2):
        put(fc, f"high{i}", priority=7, flow="g", at=20.0 + i, ttl_s=500.0)

    placed = run_pass(fc, now=30.0)

    assert [item.priority for item in placed] == [7] * 2 + [0] * 4 + [-1] * 4


def test_a_single_slot_goes_to_the_highest_band() -> None:
    fc = make()
    put(fc, "old-low", priority=0, at=0.0)
    put(fc, "new-high", priority=3, at=9.0)

    assert names(run_pass(fc, now=10.0, budget=1)) == ["new-high"]
    assert names(run_pass(fc, now=10.0, budget=1)) == ["old-low"]


def test_bands_keep_their_own_policies() -> None:
    fc = make(
        bands={
            1: BandSettings(fairness="round-robin"),
            0: BandSettings(fairness="global-strict"),
        }
    )
    for i in range(2):
        put(fc, f"hi-A{i}", priority=1, flow="A", at=float(i))
        put(fc, f"lo-A{i}", priority=0, flow="A", at=float(i))
    for i in range(2):
        put(fc, f"hi-B{i}", priority=1, flow="B", at=10.0 + i)
        put(fc, f"lo-B{i}", priority=0, flow="B", at=10.0 + i)

    placed = run_pass(fc, now=20.0)

    assert names(placed) == ["hi-A0", "hi-B0", "hi-A1", "hi-B1", "lo-A0", "lo-A1", "lo-B0", "lo-B1"]


# -- fairness across flows ----------------------------------------------------------------------


def test_global_strict_is_one_fcfs_queue_across_flows_and_lanes() -> None:
    fc = make(BandSettings(fairness="global-strict", ordering="fcfs"))
    arrivals = [
        ("A", "x"),
        ("B", "y"),
        ("B", "x"),
        ("C", "z"),
        ("A", "y"),
        ("A", "x"),
        ("C", "x"),
        ("B", "y"),
    ]
    for t, (flow, lane) in enumerate(arrivals):
        put(fc, f"r{t}", flow=flow, lane=lane, at=float(t))

    placed = run_pass(fc, now=100.0)

    assert names(placed) == [f"r{t}" for t in range(len(arrivals))]


@pytest.mark.parametrize(
    ("backlog", "expected"),
    [
        ({"A": 3, "B": 3}, "ABABAB"),
        ({"A": 4, "B": 1, "C": 2}, "ABCACAA"),
    ],
    ids=["two-flows", "flows-run-dry"],
)
def test_round_robin_takes_one_request_from_each_backlogged_flow_in_turn(
    backlog: dict[str, int], expected: str
) -> None:
    fc = make(BandSettings(fairness="round-robin"))
    t = 0.0
    for flow, count in backlog.items():  # each flow arrives as a burst, after the one before it
        for i in range(count):
            put(fc, f"{flow}{i}", flow=flow, at=t)
            t += 1.0

    placed = run_pass(fc, now=t)

    assert "".join(flows_of(placed)) == expected


def test_round_robin_counts_turns_per_flow_not_per_lane() -> None:
    fc = make(BandSettings(fairness="round-robin"))
    for i, lane in enumerate(["x", "y", "z", "x"]):
        put(fc, f"A{i}", flow="A", lane=lane, at=float(i))
    put(fc, "B0", flow="B", at=10.0)
    put(fc, "B1", flow="B", at=11.0)

    placed = run_pass(fc, now=20.0)

    assert "".join(flows_of(placed)) == "ABABAA"


@pytest.mark.parametrize("fairness", ["round-robin", "vtc"])
def test_a_request_that_leaves_undispatched_does_not_use_up_its_flows_turn(fairness: str) -> None:
    fc = make(BandSettings(fairness=fairness))
    put(fc, "A-refused", flow="A", at=0.0)
    put(fc, "A-expired", flow="A", lane="b", at=0.0, ttl_s=1.0)
    put(fc, "A-removed", flow="A", lane="c", at=0.0)
    put(fc, "A1", flow="A", at=1.0)
    put(fc, "B0", flow="B", at=2.0)
    put(fc, "A2", flow="A", at=3.0)
    fc.dispatch(
        0.5, lambda item: Placement.REFUSED if item.payload.name == "A-refused" else Placement.BLOCKED
    )
    fc.expire(1.0)
    removed = next(item for item in fc.items() if item.payload.name == "A-removed")
    fc.remove(removed.payload)

    if fairness == "vtc":  # B with more waiting: on a counter tie A goes first, unless it was charged
        put(fc, "B1", flow="B", at=4.0)

    placed = run_pass(fc, now=5.0)

    assert names(placed)[:3] == ["A1", "B0", "A2"]


@pytest.mark.parametrize(
    ("sizes", "weights"),
    [
        ({"A": 100, "B": 10}, {}),
        ({"A": 10, "B": 10}, {"A": 3.0}),
        ({"A": 50, "B": 10}, {"B": 2.0}),
        ({"A": 1, "B": 40}, {"A": 0.5, "B": 4.0}),
    ],
    ids=["bigger-requests", "weight-3", "weight-and-size", "both-weighted"],
)
def test_vtc_keeps_the_bytes_served_per_weight_level(
    sizes: dict[str, int], weights: dict[str, float]
) -> None:
    fc = make(BandSettings(fairness="vtc", weights=tuple(weights.items())))
    for i in range(60):
        for flow, size in sizes.items():
            put(fc, f"{flow}{i}", flow=flow, size=size, at=float(i))
    served = dict.fromkeys(sizes, 0.0)
    # The most one flow can be ahead: one request of its own, or one of the other's.
    slack = max(size / weights.get(flow, 1.0) for flow, size in sizes.items())

    for _ in range(50):
        (item,) = run_pass(fc, now=100.0, budget=1)
        served[item.fairness_id] += item.size / weights.get(item.fairness_id, 1.0)
        assert abs(served["A"] - served["B"]) <= slack


def test_vtc_favours_the_flow_that_was_given_fewer_bytes() -> None:
    fc = make(BandSettings(fairness="vtc"))
    for i in range(10):
        put(fc, f"big{i}", flow="big", size=1000, at=float(i))
        put(fc, f"small{i}", flow="small", size=100, at=float(i) + 0.5)

    placed = one_at_a_time(fc, now=20.0, passes=11)

    # Served level: one 1000-byte request, ten 100-byte ones, though both flows asked alike.
    assert Counter(flows_of(placed)) == {"big": 1, "small": 10}


def test_round_robin_ignores_request_sizes() -> None:
    fc = make(BandSettings(fairness="round-robin"))
    for i in range(10):
        put(fc, f"big{i}", flow="big", size=1000, at=float(i))
        put(fc, f"small{i}", flow="small", size=100, at=float(i) + 0.5)

    placed = one_at_a_time(fc, now=20.0, passes=10)

    assert Counter(flows_of(placed)) == {"big": 5, "small": 5}


@pytest.mark.parametrize(
    ("weights", "default_weight", "expected"),
    [
        ((("gold", 3.0),), 1.0, {"gold": 15, "plain": 5}),
        ((("plain", 1.0),), 4.0, {"gold": 16, "plain": 4}),
        ((), 2.0, {"gold": 10, "plain": 10}),
    ],
    ids=["named-weight", "default-weight", "all-default"],
)
def test_vtc_weights_share_dispatches_in_proportion(
    weights: tuple[tuple[str, float], ...], default_weight: float, expected: dict[str, int]
) -> None:
    fc = make(BandSettings(fairness="vtc", weights=weights, default_weight=default_weight))
    for i in range(40):
        put(fc, f"gold{i}", flow="gold", size=10, at=float(i))
        put(fc, f"plain{i}", flow="plain", size=10, at=float(i))

    placed = one_at_a_time(fc, now=50.0, passes=20)

    assert Counter(flows_of(placed)) == expected


@pytest.mark.parametrize("fairness", ["round-robin", "vtc"])
def test_a_flow_that_becomes_backlogged_starts_level_and_earns_no_credit_for_idling(fairness: str) -> None:
    fc = make(BandSettings(fairness=fairness))
    for i in range(30):
        put(fc, f"busy{i}", flow="busy", at=float(i))
    one_at_a_time(fc, now=40.0, passes=10)  # "busy" alone is served for a while
    for i in range(10):
        put(fc, f"late{i}", flow="late", at=40.0 + i)

    placed = one_at_a_time(fc, now=60.0, passes=8)

    # Without levelling "late" would take the next ten: it was never served.
    assert Counter(flows_of(placed)) == {"busy": 4, "late": 4}


@pytest.mark.parametrize("fairness", ["round-robin", "vtc"])
def test_a_flow_that_went_idle_is_not_held_back_by_what_it_was_served_before(fairness: str) -> None:
    fc = make(BandSettings(fairness=fairness))
    for i in range(10):
        put(fc, f"early{i}", flow="early", at=float(i))
    one_at_a_time(fc, now=10.0, passes=10)  # served, then idle: it keeps no counter
    for i in range(10):
        put(fc, f"other{i}", flow="other", at=10.0 + i)
    one_at_a_time(fc, now=20.0, passes=2)
    for i in range(10):
        put(fc, f"back{i}", flow="early", at=20.0 + i)

    placed = one_at_a_time(fc, now=30.0, passes=8)

    assert Counter(flows_of(placed)) == {"early": 4, "other": 4}


# -- ordering within a band ---------------------------------------------------------------------

# (name, lane, enqueued at, TTL): TTL 0 means no deadline.
ARRIVALS = [("r1", "a", 0.0, 30.0), ("r2", "b", 1.0, 5.0), ("r3", "a", 2.0, 10.0), ("r4", "b", 3.0, 0.0)]


@pytest.mark.parametrize(
    ("ordering", "expected"),
    [
        ("fcfs", ["r1", "r2", "r3", "r4"]),
        # deadlines: r1 30, r2 6, r3 12, r4 none; r3 passes r1 within lane "a" too
        ("edf", ["r2", "r3", "r1", "r4"]),
    ],
    ids=["fcfs", "edf"],
)
def test_fcfs_orders_by_arrival_and_edf_by_arrival_plus_ttl(ordering: str, expected: list[str]) -> None:
    fc = make(BandSettings(ordering=ordering))
    for name, lane, at, ttl_s in ARRIVALS:
        put(fc, name, lane=lane, at=at, ttl_s=ttl_s)

    assert names(run_pass(fc, now=4.0)) == expected


@pytest.mark.parametrize(
    ("ordering", "expected"),
    [
        ("fcfs", ["lone", "crowd0", "crowd1", "crowd2"]),
        # at t=0.9 the crowd has waited 3 × 0.36 s = 1.08 s, the lone request 0.9 s; after one of
        # the crowd goes, the crowd's 0.72 s is less than 0.9 s.
        ("total-wait", ["crowd0", "lone", "crowd1", "crowd2"]),
    ],
    ids=["fcfs", "total-wait"],
)
def test_total_wait_serves_the_lane_that_has_waited_longest_all_together(
    ordering: str, expected: list[str]
) -> None:
    fc = make(BandSettings(ordering=ordering))
    put(fc, "lone", lane="cold", at=0.0)
    for i in range(3):
        put(fc, f"crowd{i}", lane="hot", at=0.54)

    assert names(run_pass(fc, now=0.9)) == expected


def test_total_wait_compares_lanes_across_flows() -> None:
    fc = make(BandSettings(ordering="total-wait"))
    put(fc, "A-old", flow="A", lane="x", at=0.0)
    put(fc, "B-young", flow="B", lane="x", at=0.5)
    put(fc, "B-young2", flow="B", lane="x", at=0.5)
    put(fc, "B-young3", flow="B", lane="x", at=0.5)

    # A's lane has waited 0.9 s, B's 3 × 0.4 s: B's lane first, though A's request is older.
    assert names(run_pass(fc, now=0.9, budget=1)) == ["B-young"]


def test_total_wait_serves_a_lane_that_waited_past_the_cap_first_whatever_the_crowd() -> None:
    fc = make(BandSettings(ordering="total-wait"))
    put(fc, "lone", lane="cold", at=0.0)
    for i in range(10):
        put(fc, f"crowd{i}", lane="hot", at=0.05)

    # The crowd has waited nearly ten times as long all together, but the lone request has waited
    # as long as the cap allows.
    assert names(run_pass(fc, now=TOTAL_WAIT_AGE_CAP_S, budget=1)) == ["lone"]
    assert names(run_pass(fc, now=TOTAL_WAIT_AGE_CAP_S, budget=1)) == ["crowd0"]


def test_total_wait_lets_a_lone_old_request_overtake_a_steady_young_crowd() -> None:
    fc = make(BandSettings(ordering="total-wait"))
    put(fc, "lone", lane="cold", at=0.0)
    for i in range(5):
        put(fc, f"crowd{i}", lane="hot", at=0.0)
    placed: list[str] = []
    t = 0.0
    while "lone" not in placed and t < 5.0:
        t += 0.1
        put(fc, f"crowd-at-{t}", lane="hot", at=t)  # one arrives, one slot frees: the crowd stays five
        placed += names(run_pass(fc, now=t, budget=1))

    assert placed[0] != "lone"  # five waiting together outweigh one, at first
    assert "lone" in placed  # ...but its own wait keeps growing while the crowd's stays level
    assert {item.lane for item in fc.items()} == {"hot"}


def test_total_wait_forgets_the_wait_of_requests_that_left() -> None:
    fc = make(BandSettings(ordering="total-wait"))
    gone = [put(fc, f"gone{i}", lane="hot", at=1.0) for i in range(2)]
    put(fc, "hot", lane="hot", at=2.0)
    put(fc, "cold", lane="cold", at=3.5)
    put(fc, "expired", lane="cold", at=0.0, ttl_s=9.0)
    for item in gone:
        fc.remove(item.payload)
    fc.expire(9.0)

    # At t=10 "hot" has waited 8 s, "cold" 6.5 s; those that left count for neither.
    assert names(run_pass(fc, now=10.0)) == ["hot", "cold"]


def test_total_wait_orders_a_lane_by_arrival() -> None:
    fc = make(BandSettings(ordering="total-wait"))
    for i, at in enumerate([3.0, 1.0, 2.0]):
        put(fc, f"r{i}", at=at, ttl_s=10.0 - at)

    assert names(run_pass(fc, now=5.0)) == ["r1", "r2", "r0"]
