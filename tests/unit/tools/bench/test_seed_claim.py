"""The seed's headline table: its four figures computed from a result, and printed beside ours."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from epp.tools.bench import report, runner, scenario, seed_claim


@pytest.fixture(scope="module")
def seed_run() -> runner.BenchResult:
    """A short real run of the seed's scenario, without the replica search."""
    sc = scenario.load("seed-conditions").with_overrides(duration_s=120.0)
    return runner.run_bench(sc, ["default", "round-robin"], search_replicas=False)


def _with(result: runner.BenchResult, changes: Mapping[str, Mapping[str, Any]]) -> runner.BenchResult:
    """`result` with some of each policy's figures replaced."""
    summaries = {
        name: dataclasses.replace(summary, **changes.get(name, {}))
        for name, summary in result.summaries.items()
    }
    return dataclasses.replace(result, summaries=summaries)


@pytest.fixture(scope="module")
def known(seed_run: runner.BenchResult) -> runner.BenchResult:
    """The run with figures set so that ours are exactly the seed's."""
    result = _with(
        seed_run,
        {
            "default": {
                "swaps_per_1k": 100.0,
                "adapter_hit_rate": 0.78,
                "e2e_p50_s": 0.42,
                "replicas_for_slo": 2,
            },
            "round-robin": {"swaps_per_1k": 320.0, "e2e_p50_s": 1.0, "replicas_for_slo": 4},
        },
    )
    dedicated: dict[str, int | None] = {f"adapter-{i:03d}": 1 for i in range(5)}
    return dataclasses.replace(result, dedicated=dedicated)


def test_the_four_figures_follow_their_definitions(known: runner.BenchResult) -> None:
    figures = seed_claim.seed_figures(known)
    assert figures.swap_ratio == pytest.approx(3.2)
    assert figures.adapter_hit_rate == pytest.approx(0.78)
    assert figures.p50_latency_cut == pytest.approx(0.58)
    assert figures.gpu_cost_cut == pytest.approx(0.60)  # 2 shared replicas against 5 dedicated
    assert (figures.shared_replicas, figures.dedicated_replicas) == (2, 5)


def test_stdout_and_markdown_print_the_seed_beside_ours(known: runner.BenchResult, tmp_path: Path) -> None:
    table = report.format_table(known)
    assert "The seed's claim beside ours:" in table
    assert "60% (2 vs 5 replicas)" in table and "Conditions: 5 adapters" in table
    report.write_outputs(known, tmp_path, command="epp bench --scenario seed-conditions")
    md = (tmp_path / "report.md").read_text()
    assert "| fewer swaps vs round robin | 3.2x | 3.2x |" in md
    assert "| lower P50 latency vs round robin | 58% | 58% |" in md
    seed = json.loads((tmp_path / "results.json").read_text())["comparisons"]["seed_claim"]
    assert seed["gpu_cost_cut"] == pytest.approx(0.60) and seed["swap_ratio"] == pytest.approx(3.2)


def test_without_the_replica_search_the_gpu_figure_says_what_it_needs(seed_run: runner.BenchResult) -> None:
    rows = {row[0]: row for row in seed_claim.seed_rows(seed_run)}
    assert rows["GPU cost reduction"][2] == "- (needs the replica search)"
    figures = seed_claim.seed_figures(seed_run)
    rr, ours = seed_run.summaries["round-robin"], seed_run.summaries["default"]
    assert figures.p50_latency_cut == pytest.approx(1 - ours.e2e_p50_s / rr.e2e_p50_s)


def test_other_scenarios_have_no_seed_section(seed_run: runner.BenchResult) -> None:
    other = dataclasses.replace(seed_run, scenario=dataclasses.replace(seed_run.scenario, name="dedicated"))
    assert "seed's claim" not in report.format_table(other)
    assert "seed_claim" not in report.comparisons(other)
