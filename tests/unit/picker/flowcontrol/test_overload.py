"""The overload judge and what the controller gives it: memory bounded by what waits, overdue and
shed requests taken out, a newcomer's position, fairness by tokens."""

from __future__ import annotations

import math

import pytest

from epp.picker.flowcontrol.controller import FlowController, Placement
from epp.picker.flowcontrol.overload import DispatchRate, OverloadJudge, OverloadSettings, RefusalReason
from epp.picker.flowcontrol.queues import QueueItem
from epp.picker.flowcontrol.settings import BandSettings, FlowControlSettings
from tests.unit.picker.flowcontrol.helpers import Req, names, put


def make(fairness: str = "global-strict") -> FlowController[Req]:
    return FlowController(FlowControlSettings(enabled=True, default_band=BandSettings(fairness=fairness)))


def place_all_but(blocked_lane: str):  # type: ignore[no-untyped-def]
    def place(item: QueueItem[Req]) -> Placement:
        return Placement.BLOCKED if item.lane == blocked_lane else Placement.PLACED

    return place


# -- memory follows what waits ------------------------------------------------------------------


def test_the_deadline_heap_holds_only_about_what_waits() -> None:
    """A thousand requests pass through while one waits: the heap must not keep all of them
    until their TTL (before, it held every one: memory grew with rate × TTL)."""
    fc = make()
    put(fc, "stuck", lane="blocked", ttl_s=60.0)
    for i in range(1000):
        put(fc, f"r{i}", lane="open", at=i * 0.01, ttl_s=60.0)
        fc.dispatch(i * 0.01, place_all_but("blocked"))
    assert len(fc) == 1
    assert fc.held <= 2 * len(fc) + 64
    assert names(fc.expire(61.0)) == ["stuck"]  # the one still waiting keeps its deadline


def test_a_lanes_heap_is_rebuilt_once_most_of_it_has_left() -> None:
    fc = make()
    items = [put(fc, f"r{i}", at=float(i)) for i in range(300)]
    for item in items[1:]:  # every one but the head leaves from inside the lane
        fc.remove(item.payload)
    lane = next(iter(fc._bands[0].flows["t"].lanes.values()))
    assert len(lane._heap) <= 2 * lane.count + 16
    assert names(fc.dispatch(1000.0, lambda item: Placement.PLACED).placed) == ["r0"]


# -- taking out ---------------------------------------------------------------------------------


def test_overdue_takes_out_what_waited_past_the_bound_oldest_first() -> None:
    fc = make()
    put(fc, "old-a", lane="a", at=0.0)
    put(fc, "old-b", lane="b", at=0.5)
    put(fc, "young-a", lane="a", at=1.6)
    put(fc, "high-old", priority=5, lane="a", at=0.0)
    gone = fc.overdue(2.0, 1.0, below=5)
    assert sorted(names(gone)) == ["old-a", "old-b"]
    assert sorted(names(list(fc.items()))) == ["high-old", "young-a"]
    assert names(fc.overdue(2.0, 1.0)) == ["high-old"]


def test_take_below_sheds_only_lower_bands() -> None:
    fc = make()
    put(fc, "critical", priority=10)
    put(fc, "standard", priority=0)
    put(fc, "sheddable", priority=-10, lane="x")
    put(fc, "sheddable-2", priority=-1)
    assert sorted(names(fc.take_below(0))) == ["sheddable", "sheddable-2"]
    assert fc.waiting_from(0) == 2 and fc.waiting_from(1) == 1 and len(fc) == 2


# -- a newcomer's position ----------------------------------------------------------------------


def test_position_counts_higher_bands_and_the_whole_band_under_global_strict() -> None:
    fc = make()
    for i in range(3):
        put(fc, f"hi{i}", priority=10)
    for i in range(4):
        put(fc, f"std{i}", flow=f"tenant{i}")
    assert fc.position(10, "x") == 3
    assert fc.position(0, "new") == 7
    assert fc.position(-1, "new") == 7


def test_under_vtc_a_flooding_tenants_backlog_counts_against_it_alone() -> None:
    fc = make("vtc")
    for i in range(50):
        put(fc, f"flood{i}", flow="flood", at=float(i))
    put(fc, "steady0", flow="steady", at=50.0)
    # A new flow ties the flood's counter and has fewer waiting: nothing of the flood is ahead of it.
    assert fc.position(0, "quiet") == 0
    assert fc.position(0, "steady") == 1  # its own one request
    assert fc.position(0, "flood") == 50 + 1  # its own backlog, and the steady one interleaved


# -- fairness by tokens -------------------------------------------------------------------------


def test_vtc_charges_tokens_at_dispatch_and_output_at_finish() -> None:
    fc = make("vtc")
    fc.enqueue(Req("big"), fairness_id="A", priority=0, lane="a", size=10, now=0.0, ttl_s=0.0, cost=1000)
    fc.enqueue(Req("small"), fairness_id="B", priority=0, lane="b", size=10_000, now=0.0, ttl_s=0.0, cost=10)
    for i in range(3):
        fc.enqueue(Req(f"A{i}"), fairness_id="A", priority=0, lane="a", size=1, now=1.0, ttl_s=0.0, cost=10)
        fc.enqueue(Req(f"B{i}"), fairness_id="B", priority=0, lane="b", size=1, now=1.0, ttl_s=0.0, cost=10)
    placed = names(fc.dispatch(2.0, lambda item: Placement.PLACED).placed)
    # A's 1000-token request put it far behind B: B's requests go before A's next ones, though B's
    # first request carried more bytes.
    assert placed[:2] == ["big", "small"] or placed[:2] == ["small", "big"]
    assert placed.index("B2") < placed.index("A0")


def test_output_tokens_charged_to_a_backlogged_flow_move_it_back() -> None:
    fc = make("vtc")
    put(fc, "A0", flow="A", lane="a", at=0.0)
    put(fc, "B0", flow="B", lane="b", at=0.0)
    fc.charge(0, "A", 500)  # A's earlier request finished with many output tokens
    assert names(fc.dispatch(1.0, lambda item: Placement.PLACED).placed) == ["B0", "A0"]


# -- the judge ----------------------------------------------------------------------------------


def test_the_dispatch_rate_is_counted_over_its_window() -> None:
    rate = DispatchRate(2.0)
    assert rate.per_second(0.0) == 0.0
    for i in range(10):
        rate.record(10.0 + i * 0.1)  # 10 per second for a second
    assert rate.per_second(11.0) == pytest.approx(10.0)
    assert rate.per_second(12.0) == pytest.approx(5.0)  # the same ten over the whole window
    assert rate.per_second(14.0) == 0.0


def judge(target_s: float = 0.5) -> OverloadJudge:
    """A judge that has measured 10 dispatches a second for 2 s, and a queue that stands."""
    j = OverloadJudge(OverloadSettings(wait_target_s=target_s))
    for i in range(20):
        j.dispatched(i * 0.1)
    j.observe(True, 1.0, 2.0)
    return j


def test_a_sheddable_newcomer_is_refused_at_once() -> None:
    verdict = judge().on_arrival(-1, 0, 2.0)
    assert verdict is not None and verdict.reason is RefusalReason.SHEDDABLE
    assert verdict.retry_after_s >= 1


@pytest.mark.parametrize(("ahead", "refused"), [(0, False), (3, False), (4, True), (40, True)])
def test_a_newcomer_is_refused_when_its_estimated_wait_passes_the_target(ahead: int, refused: bool) -> None:
    verdict = judge(0.45).on_arrival(0, ahead, 2.0)  # (ahead + 1) / 10 per second
    assert (verdict is not None) is refused
    if verdict is not None:
        assert verdict.reason is RefusalReason.PREDICTED_WAIT
        assert verdict.estimated_wait_s == pytest.approx((ahead + 1) / 10)
        assert verdict.retry_after_s == max(1, math.ceil((ahead + 1) / 10))


def test_an_epp_with_no_rate_measured_yet_lets_a_newcomer_wait_but_still_sheds() -> None:
    j = OverloadJudge(OverloadSettings())  # just started, or took over: nothing dispatched yet
    j.observe(True, 5.0, 5.0)
    assert not j.standing(5.0) and j.on_arrival(0, 100, 5.0) is None
    verdict = j.on_arrival(-1, 0, 5.0)
    assert verdict is not None and verdict.reason is RefusalReason.SHEDDABLE
    assert math.isinf(verdict.estimated_wait_s) and verdict.retry_after_s == 1


def test_with_a_standing_time_a_burst_is_not_overload_until_a_request_has_waited_that_long() -> None:
    j = OverloadJudge(OverloadSettings(standing_s=1.0))
    for i in range(20):
        j.dispatched(i * 0.1)
    j.observe(True, None, 2.0)  # a look found the queue empty: it no longer stands
    j.observe(True, 0.5, 2.5)
    assert j.on_arrival(0, 40, 2.5) is None  # the oldest waited 0.5 s: a burst, it waits
    j.observe(False, 1.2, 2.7)  # waited long, but the pool had room: the queue moves
    assert not j.standing(2.7)
    j.observe(True, 1.1, 3.6)  # saturated with a request a second old: overload
    verdict = j.on_arrival(0, 40, 3.6)
    assert verdict is not None and verdict.reason is RefusalReason.PREDICTED_WAIT
    j.observe(True, 0.1, 3.7)  # it stands until a look finds the queue empty
    assert j.standing(3.7)


def test_refusals_are_counted_by_band_and_reason() -> None:
    j = judge()
    j.on_arrival(-1, 0, 2.0)
    j.on_arrival(0, 100, 2.0)
    j.waited_too_long(0, 0.6)
    assert j.refusals == {
        (-1, RefusalReason.SHEDDABLE): 1,
        (0, RefusalReason.PREDICTED_WAIT): 1,
        (0, RefusalReason.WAITED_TOO_LONG): 1,
    }


@pytest.mark.parametrize(
    "bad", [{"wait_target_s": -1.0}, {"rate_window_s": 0.0}, {"wait_target_s": math.nan}]
)
def test_bad_settings_are_refused(bad: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        OverloadSettings(**bad)


def test_oldest_from_reads_the_oldest_head_at_or_above_a_priority() -> None:
    fc = make()
    assert fc.oldest_from(0, 10.0) is None
    put(fc, "shed", priority=-1, at=1.0)
    assert fc.oldest_from(0, 10.0) is None  # a band below is not counted
    put(fc, "std", lane="a", at=4.0)
    put(fc, "std-older", lane="b", at=3.0)
    put(fc, "critical", priority=10, at=6.0)
    assert fc.oldest_from(0, 10.0) == pytest.approx(7.0)
    assert fc.oldest_from(10, 10.0) == pytest.approx(4.0)
