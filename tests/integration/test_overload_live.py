"""`benchmarks.overload_live` end to end on a tiny fleet and seconds of traffic: both scenarios run
live and simulated for two policies, every figure of both tables is filled in, and each refusal
came back as a JSON error carrying its 429 or 503."""

from __future__ import annotations

import math

import pytest

from benchmarks import overload_live
from benchmarks.overload_live import FLOOD, MIX, Row, Scale

pytestmark = pytest.mark.integration

POLICIES = ("default", "least-queue")
# Two pods of two sequences (≈ 0.35 s a request: saturated near 10 req/s) offered ≈ 18 req/s, so
# the pods' queues pass the EPP's saturation threshold within the first second and it refuses.
TINY = Scale(
    pods=2,
    max_num_seqs=2,
    time_to_first_token_s=0.05,
    inter_token_latency_s=0.05,
    output_tokens=(4, 8),
    capacity_rps=12.0,
    flood_duration_s=2.0,
    flood_warmup_s=0.5,
    flood_at_s=0.5,
    flood_for_s=1.0,
    mix_duration_s=2.0,
    mix_warmup_s=0.5,
    request_timeout_s=15.0,
)


def _live(rows: list[Row]) -> list[Row]:
    return [r for r in rows if r.run == "live"]


def _table_rows(text: str, title: str) -> list[list[str]]:
    """The cells of the markdown table under `### title`, header first."""
    section = text.split(f"### {title}\n", 1)[1].strip().split("\n\n", 1)[0]
    return [
        [c.strip() for c in line.strip("|").split("|")] for line in section.splitlines() if "---|" not in line
    ]


@pytest.mark.timeout(60)
def test_both_overload_tables_are_filled_live_and_refusals_are_json_errors() -> None:
    outcome = overload_live.run(POLICIES, scale=TINY, seed=1)
    text = outcome.markdown(TINY)

    for name in (FLOOD, MIX):
        rows = outcome.rows[name]
        runs = ("live", "sim", overload_live.PROBED)
        assert [(r.policy, r.run) for r in rows] == [(p, run) for p in POLICIES for run in runs]
        table = _table_rows(text, name)
        header, body = table[0], table[1:]
        assert len(body) == len(rows)
        assert all(len(cells) == len(header) and all(cells) for cells in body), table
        for row in _live(rows):
            s = row.summary
            assert s.requests > 0 and math.isfinite(s.ttft_p99_s) and 0 <= s.slo_goodput <= 1
            assert row.extras.errors == 0, row
            assert math.isfinite(row.extras.live.epp_cpu) and row.extras.live.epp_cpu < 1.0
        assert "agree" in text.split(f"### {name}", 1)[1]
    assert outcome.probe is not None and math.isfinite(outcome.probe.step_s)
    assert "Probe of the idle fleet" in text

    for row in outcome.rows[FLOOD]:
        s = row.summary
        assert math.isfinite(s.steady_ttft_p99_s) and math.isfinite(s.steady_ttft_p99_no_flood_s)
        assert math.isfinite(s.flooding_ttft_p99_s) and s.steady_flood_ratio is not None
    for row in outcome.rows[MIX]:
        assert [p.objective for p in row.summary.by_priority] == ["critical", "standard", "sheddable"]
        assert sum(p.requests for p in row.summary.by_priority) == row.summary.requests

    refused = sum(
        r.summary.refused_429 + r.summary.refused_503 for n in (FLOOD, MIX) for r in _live(outcome.rows[n])
    )
    assert refused > 0, "the overload made the EPP refuse"
    assert outcome.bad_refusals() == []
    shed = [r for r in _live(outcome.rows[MIX]) if r.summary.by_priority[-1].refused]
    assert all(math.isfinite(r.extras.lowest_refusal_p99_s) for r in shed)
