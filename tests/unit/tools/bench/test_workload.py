"""Workloads: popularity, arrivals, trace replay and prompt text."""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import itertools
from pathlib import Path

import numpy as np
import pytest

from epp.tools.bench import workload

TRACE_SHA256 = "2f1e5b666d4e3055fdbba98598ce2ec307767b9064e03e2fa46676dbcc7d0bf8"


def test_packaged_trace_is_the_attributed_copy() -> None:
    path = workload.resolve_trace("azure-conv")
    assert hashlib.sha256(path.read_bytes()).hexdigest() == TRACE_SHA256
    rows = workload.read_trace(path)
    assert len(rows) == 19_366
    assert rows[0].offset_s == 0.0
    assert (rows[0].context_tokens, rows[0].generated_tokens) == (374, 44)
    assert all(a.offset_s <= b.offset_s for a, b in itertools.pairwise(rows))
    assert 58 * 60 < rows[-1].offset_s < 59 * 60


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("TIMESTAMP,ContextTokens\n2023-11-16 18:15:46.6805900,374\n", "lacks columns GeneratedTokens"),
        ("TIMESTAMP,ContextTokens,GeneratedTokens\n", "no rows"),
        ("TIMESTAMP,ContextTokens,GeneratedTokens\nyesterday,1,2\n", "line 2"),
    ],
    ids=["missing-column", "empty", "bad-timestamp"],
)
def test_bad_trace_gives_a_clear_error(tmp_path: Path, text: str, error: str) -> None:
    path = tmp_path / "t.csv"
    path.write_text(text)
    with pytest.raises(ValueError, match=error):
        workload.read_trace(path)


def test_unknown_trace_name() -> None:
    with pytest.raises(ValueError, match="neither a packaged trace nor a file"):
        workload.resolve_trace("no-such-trace")


@pytest.mark.parametrize(("alpha", "count"), [(1.0, 100), (0.5, 10), (0.0, 5)], ids=["a1", "a0.5", "uniform"])
def test_zipf_weights(alpha: float, count: int) -> None:
    weights = workload.zipf_weights(count, alpha)
    assert weights.sum() == pytest.approx(1.0)
    assert weights[0] / weights[-1] == pytest.approx(count**alpha)


def test_tier_weights_follow_gie_tiers() -> None:
    weights = workload.tier_weights([(5, 0.12), (5, 0.06), (5, 0.02)])
    assert weights.size == 15
    assert weights[:5].sum() == pytest.approx(0.60)
    assert weights[10:].sum() == pytest.approx(0.10)


@pytest.mark.parametrize("cv", [1.0, 4.0], ids=["poisson", "bursty"])
def test_gamma_arrivals_have_the_asked_rate_and_cv(cv: float) -> None:
    rng = np.random.default_rng(7)
    times = workload.gamma_arrivals(rng, rate_rps=50.0, cv=cv, duration_s=2000.0)
    gaps = np.diff(times)
    assert times.size / 2000.0 == pytest.approx(50.0, rel=0.1)
    assert gaps.std() / gaps.mean() == pytest.approx(cv, rel=0.15)
    assert np.all(gaps >= 0) and times[-1] < 2000.0


def _spec(**overrides: object) -> workload.WorkloadSpec:
    base: dict[str, object] = {
        "duration_s": 60.0,
        "adapters": workload.adapter_names(5),
        "popularity": np.full(5, 0.2),
        "rate_rps": 10.0,
        "system_prompt_tokens": 64,
    }
    base.update(overrides)
    return workload.WorkloadSpec(**base)  # type: ignore[arg-type]


def test_same_seed_same_requests_other_seed_other_requests() -> None:
    def signature(seed: int) -> list[tuple[float, str, int, int]]:
        return [
            (r.arrival_s, r.adapter, r.prompt_tokens, r.output_tokens)
            for r in workload.generate(_spec(), seed)
        ]

    assert signature(3) == signature(3)
    assert signature(3) != signature(4)


def test_trace_replay_keeps_arrivals_and_token_counts() -> None:
    rows = tuple(workload.read_trace(workload.resolve_trace("azure-conv")))
    requests = workload.generate(_spec(trace=rows, duration_s=30.0, trace_time_scale=2.0), seed=1)
    expected = [r for r in rows if r.offset_s / 2.0 < 30.0]
    assert len(requests) == len(expected)
    assert requests[5].arrival_s == pytest.approx(expected[5].offset_s / 2.0)
    assert requests[5].prompt_tokens == expected[5].context_tokens + 64
    assert requests[5].output_tokens == expected[5].generated_tokens


def test_prompt_text_shares_the_prefix_per_adapter_only() -> None:
    a, b, c = workload.generate(_spec(adapters=("x", "y"), popularity=np.array([0.5, 0.5])), seed=2)[:3]
    same = [r for r in (b, c) if r.adapter == a.adapter]
    other = [r for r in (b, c) if r.adapter != a.adapter]
    prefix_chars = 64 * 4
    if same:
        assert workload.prompt_text(same[0])[:prefix_chars] == workload.prompt_text(a)[:prefix_chars]
    if other:
        assert workload.prompt_text(other[0])[:prefix_chars] != workload.prompt_text(a)[:prefix_chars]
    assert workload.prompt_text(a) != workload.prompt_text(b)
    assert len(workload.prompt_text(a)) <= 64 * 256


def _zipf_spec(**changes: object) -> workload.WorkloadSpec:
    spec = workload.WorkloadSpec(
        duration_s=400.0,
        adapters=workload.adapter_names(20),
        popularity=workload.zipf_weights(20, 1.2),
        rate_rps=50.0,
    )
    return dataclasses.replace(spec, **changes)  # type: ignore[arg-type]


def test_a_popularity_shift_hands_the_hot_adapters_popularity_to_others() -> None:
    shifted = workload.generate(_zipf_spec(shift=workload.PopularityShift(at_s=200.0, rotate=10)), seed=2)
    before = collections.Counter(r.adapter for r in shifted if r.arrival_s < 200.0)
    after = collections.Counter(r.adapter for r in shifted if r.arrival_s >= 200.0)
    assert before.most_common(1)[0][0] == "adapter-000"
    assert after.most_common(1)[0][0] == "adapter-010"
    assert after["adapter-000"] < after["adapter-010"] / 5
    # Before the shift the list is the one the same spec without a shift gives.
    plain = workload.generate(_zipf_spec(), seed=2)
    assert [(r.arrival_s, r.adapter) for r in plain if r.arrival_s < 200.0] == [
        (r.arrival_s, r.adapter) for r in shifted if r.arrival_s < 200.0
    ]


def test_a_diurnal_swing_moves_the_rate_around_its_mean() -> None:
    swing = workload.DiurnalSwing(period_s=200.0, amplitude=0.6)
    requests = workload.generate(_zipf_spec(diurnal=swing), seed=5)
    times = np.array([r.arrival_s for r in requests])
    peak = np.sum((times % 200.0 >= 25.0) & (times % 200.0 < 75.0))  # around the sine's top
    trough = np.sum((times % 200.0 >= 125.0) & (times % 200.0 < 175.0))
    assert peak > 2.5 * trough
    assert abs(times.size / 400.0 - 50.0) < 5.0  # the mean rate stays rate_rps
