"""Fair shares: which flows ask for more than their max-min share of what the pool dispatches."""

from __future__ import annotations

import pytest

from epp.picker.flowcontrol.fairshare import FairShares, FairShareSettings

WINDOW_S = 5.0


def shares_with(arrivals: dict[tuple[int, str], float], dispatched_rps: float) -> FairShares:
    """FairShares that saw each (band, flow) arrive at its rate, and the pool dispatch at its own,
    evenly over the last ten seconds."""
    shares = FairShares(FairShareSettings(window_s=WINDOW_S))
    for (priority, flow), rate in arrivals.items():
        n = round(rate * 10)
        for i in range(n):
            shares.arrived(priority, flow, 10.0 * i / n)
    n = round(dispatched_rps * 10)
    for i in range(n):
        shares.dispatched(10.0 * i / n)
    return shares


def test_a_flood_is_over_its_share_and_the_steady_tenants_are_not() -> None:
    """tenant-flood's shape: steady tenants ask 2.9, 1.5 and 0.5 a second, one floods at 9.8, the
    pool dispatches 12: the water level (7.1 left for two flows) leaves the flood alone over it."""
    shares = shares_with({(0, "big"): 2.9, (0, "mid"): 1.5, (0, "small"): 0.5, (0, "flood"): 9.8}, 12.0)
    over = {flow for flow in ("big", "mid", "small", "flood") if shares.over_share(0, flow, 10.0)}
    assert over == {"flood"}


def test_nobody_is_over_while_the_pool_takes_everything_asked() -> None:
    shares = shares_with({(0, "a"): 3.0, (0, "b"): 6.0}, 12.0)
    assert not shares.over_share(0, "a", 10.0)
    assert not shares.over_share(0, "b", 10.0)


def test_every_flow_over_an_even_split_is_over() -> None:
    """Two heavy flows and a light one in 6 a second: 1 for the light one, 2.5 each left for the
    others, who both ask more."""
    shares = shares_with({(0, "light"): 1.0, (0, "h1"): 4.0, (0, "h2"): 5.0}, 6.0)
    assert [shares.over_share(0, flow, 10.0) for flow in ("light", "h1", "h2")] == [False, True, True]


def test_a_band_alone_over_what_is_left_is_not_held_strict_priority_decides() -> None:
    """Critical (10) takes 4.5 of 15 a second, Standard (0) asks 11: Standard is one flow, with
    nobody in its band to keep slots for, so it is not held back."""
    shares = shares_with({(10, ""): 4.5, (0, ""): 11.0}, 15.0)
    assert not shares.over_share(10, "", 10.0)
    assert not shares.over_share(0, "", 10.0)


def test_a_lower_band_gets_what_the_higher_ones_leave() -> None:
    """Critical takes 8 of 10; in the band below, 2 a second are left for two flows: one asking
    0.5 is within, the other asking 3 is over."""
    shares = shares_with({(10, ""): 8.0, (0, "low"): 0.5, (0, "high"): 3.0}, 10.0)
    assert not shares.over_share(0, "low", 10.0)
    assert shares.over_share(0, "high", 10.0)


def test_a_flow_that_stopped_asking_is_forgotten() -> None:
    shares = shares_with({(0, "small"): 1.0, (0, "flood"): 20.0}, 5.0)
    assert shares.over_share(0, "flood", 10.0)
    later = 10.0 + WINDOW_S + 1.0
    shares.arrived(0, "small", later)
    assert not shares.over_share(0, "flood", later)
    assert "flood" not in {flow for _, flow in shares.rates(later)}


@pytest.mark.parametrize(("share", "slots", "kept"), [(0.05, 256, 13), (0.05, 16, 1), (0.1, 64, 7)])
def test_the_reserve_is_a_share_of_the_batch_slots_at_least_one(share: float, slots: int, kept: int) -> None:
    assert FairShareSettings(reserve_share=share).reserve(slots) == kept


@pytest.mark.parametrize("bad", [{"window_s": 0.0}, {"reserve_share": 1.0}, {"reserve_share": -0.1}])
def test_bad_settings_are_refused(bad: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        FairShareSettings(**bad)


def test_memory_follows_the_windows_however_many_flows_come_and_go() -> None:
    """A tenant ID per request for an hour, the pool never overloaded (nobody asks who is over):
    what is kept is the last windows' arrivals, not the hour's."""
    shares = FairShares(FairShareSettings(window_s=WINDOW_S))
    for i in range(36_000):
        at = i * 0.1
        shares.arrived(0, f"tenant-{i}", at)
        shares.dispatched(at)
    assert len(shares.rates(3_600.0)) <= 2 * WINDOW_S * 10
    assert shares.capacity(3_600.0) == pytest.approx(10.0, abs=0.2)
    assert shares.held <= 2 * (WINDOW_S + 10.0) * 10
