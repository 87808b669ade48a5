"""Retry delays after failed scrapes: growing, capped, jittered, never faster than the interval."""

from __future__ import annotations

import random

import pytest

from epp.picker.scrape.backoff import Backoff

BACKOFF = Backoff(base_s=0.1, cap_s=5.0, floor_s=0.1)


@pytest.mark.parametrize(
    ("failures", "low_s", "high_s"),
    [
        (1, 0.1, 0.1),
        (2, 0.1, 0.2),
        (3, 0.2, 0.4),
        (6, 1.6, 3.2),
        (7, 2.5, 5.0),
        (50, 2.5, 5.0),
        (10_000, 2.5, 5.0),
    ],
    ids=["first", "second", "third", "sixth", "capped", "long-outage", "huge-count"],
)
def test_delay_grows_then_caps(failures: int, low_s: float, high_s: float) -> None:
    rng = random.Random(7)
    delays = [BACKOFF.delay_s(failures, rng) for _ in range(200)]
    assert all(low_s <= d <= high_s for d in delays)


def test_delays_are_jittered() -> None:
    rng = random.Random(7)
    assert len({BACKOFF.delay_s(8, rng) for _ in range(20)}) == 20


def test_floor_wins_over_a_small_cap() -> None:
    assert Backoff(base_s=0.05, cap_s=0.1, floor_s=1.0).delay_s(3, random.Random(1)) == 1.0


@pytest.mark.parametrize(
    "kwargs",
    [
        {"base_s": 0.0, "cap_s": 1.0},
        {"base_s": 1.0, "cap_s": -1.0},
        {"base_s": 1.0, "cap_s": 1.0, "floor_s": -1.0},
    ],
    ids=["zero-base", "negative-cap", "negative-floor"],
)
def test_bad_parameters_are_refused(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError, match="positive"):
        Backoff(**kwargs)


def test_no_delay_without_a_failure() -> None:
    with pytest.raises(ValueError, match="one or more failures"):
        BACKOFF.delay_s(0, random.Random(1))
