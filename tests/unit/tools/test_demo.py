"""`epp demo`'s workload and report, without starting anything."""

from __future__ import annotations

import collections

import pytest

from epp.tools.demo import RunResult, adapter_names, format_table, workload


def test_workload_is_seeded_and_skewed() -> None:
    adapters = adapter_names(8)
    plan = workload(adapters, 2000, seed=7)
    assert plan == workload(adapters, 2000, seed=7)
    assert plan != workload(adapters, 2000, seed=8)
    counts = collections.Counter(plan)
    assert set(counts) <= set(adapters)
    assert counts["adapter-0"] > 3 * counts["adapter-7"]


@pytest.mark.parametrize(
    ("requests", "errors", "loads", "hit_rate"),
    [(100, 0, 10, 0.9), (100, 20, 8, 0.9), (10, 0, 20, 0.0), (5, 5, 0, 0.0)],
    ids=["no-errors", "errors-not-counted", "more-loads-than-requests", "all-failed"],
)
def test_hit_rate(requests: int, errors: int, loads: int, hit_rate: float) -> None:
    result = RunResult("epp", requests, errors, loads, (), 1.0)
    assert result.hit_rate == pytest.approx(hit_rate)


def test_percentiles_and_table() -> None:
    result = RunResult("epp", 100, 0, 3, tuple(i / 1000 for i in range(1, 101)), 2.0)
    assert result.percentile_s(0.50) == pytest.approx(0.050)
    assert result.percentile_s(0.99) == pytest.approx(0.099)
    table = format_table([result]).splitlines()
    assert table[0].split() == [
        "routing",
        "requests",
        "errors",
        "adapter",
        "loads",
        "hit",
        "rate",
        "P50",
        "ms",
        "P99",
        "ms",
    ]
    assert table[2].split() == ["epp", "100", "0", "3", "97.0%", "50", "99"]
    assert result.as_json()["adapter_hit_rate"] == 0.97
