"""Outputs: results.json keys, report.md, PNG plots; and the `epp bench` command end to end."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pytest

from epp.cli import main
from epp.tools.bench import report, runner, scenario

REQUIRED_KEYS = {
    "requests",
    "swaps_per_1k",
    "adapter_hit_rate",
    "prefix_hit_rate",
    "ttft_p50_s",
    "ttft_p99_s",
    "e2e_p50_s",
    "e2e_p99_s",
    "throughput_rps",
    "slo_goodput",
    "replicas_for_slo",
}
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def small_result() -> runner.BenchResult:
    sc = scenario.load("dedicated").with_overrides(duration_s=30.0, replicas=2)
    sc = dataclasses.replace(sc, slo=scenario.Slo(ttft_s=1.0, target_goodput=0.9, max_replicas=6))
    return runner.run_bench(sc, ["default", "round-robin"], search_replicas=True)


def test_outputs_are_written_and_well_formed(tmp_path: Path, small_result: runner.BenchResult) -> None:
    written = report.write_outputs(small_result, tmp_path, command="epp bench --scenario dedicated")
    names = {p.name for p in written}
    plots = {"latency_cdf.png", "swaps.png", "swaps_over_time.png", "replicas_for_slo.png"}
    assert {"results.json", "report.md", *plots} <= names
    for png in tmp_path.glob("*.png"):
        assert png.read_bytes()[:8] == PNG_MAGIC
    doc = json.loads((tmp_path / "results.json").read_text())
    assert set(doc["policies"]) == {"default", "round-robin"}
    for figures in doc["policies"].values():
        assert set(figures) >= REQUIRED_KEYS
        assert figures["requests"] > 0
    dedicated = doc["comparisons"]["dedicated"]
    assert set(dedicated["per_adapter_replicas"]) == {f"adapter-{i:03d}" for i in range(5)}
    md = (tmp_path / "report.md").read_text()
    assert "| default |" in md and "![latency_cdf](latency_cdf.png)" in md


def test_swaps_over_time_add_up_to_each_policys_count_and_the_floors() -> None:
    sc = scenario.load("zipf-100").with_overrides(duration_s=40.0)
    result = runner.run_bench(sc, ["default", "round-robin"], search_replicas=False)
    measured = result.summaries["default"].requests
    assert len(result.floor_swap_times_s) == round(result.swaps_floor_per_1k * measured / 1000)
    assert result.floor_swap_times_s, "100 adapters on fewer slots need swaps"
    for s in result.summaries.values():
        assert len(s.swap_times_s) == s.swaps > 0
        assert list(s.swap_times_s) == sorted(s.swap_times_s)
        assert min(s.swap_times_s) >= sc.warmup_s
        assert s.swaps >= s.swaps_floor_per_1k * s.requests / 1000  # no policy beats its floor


def test_table_has_one_row_per_policy(small_result: runner.BenchResult) -> None:
    lines = report.format_table(small_result).splitlines()
    assert lines[0].startswith("policy")
    assert [line.split()[0] for line in lines[2:4]] == ["default", "round-robin"]


@pytest.mark.parametrize(
    ("baseline", "ours", "expected"),
    [(10.0, 2.0, 0.8), (math.inf, 1.0, 1.0), (1.0, math.inf, None), (2.0, 2.0, 0.0)],
    ids=["lower", "baseline-never-served", "ours-never-served", "equal"],
)
def test_reduction(baseline: float, ours: float, expected: float | None) -> None:
    assert report._reduction(baseline, ours) == expected


def test_cli_writes_results(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(
        [
            "bench",
            "--scenario",
            "brief",
            "--policies",
            "default,round-robin",
            "--duration",
            "20s",
            "--replicas",
            "2",
            "--replica-search=false",
            "--progress=false",
            "--out",
            str(tmp_path),
        ]
    )
    assert code == 0
    out = capsys.readouterr().out
    assert "default" in out and "round-robin" in out
    doc = json.loads((tmp_path / "results.json").read_text())
    assert doc["scenario"]["replicas"] == 2
    assert doc["policies"]["default"]["replicas_for_slo"] is None


def test_cli_compares_epp_replica_counts(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["bench", "--scenario", "brief", "--policies", "default,round-robin", "--duration", "20s"]
    code = main(
        [*argv, "--epp-replicas", "1,2", "--replica-search=false", "--progress=false", "--out", str(tmp_path)]
    )
    assert code == 0
    out = capsys.readouterr().out
    assert "1 EPP replica\n" in out and "2 EPP replicas\n" in out
    for count in (1, 2):
        doc = json.loads((tmp_path / f"epp-replicas-{count}" / "results.json").read_text())
        assert doc["scenario"]["epp_replicas"] == count
        assert doc["scenario"]["epp_peers"] is True  # replicas exchange their routing unless told not to
    summary = json.loads((tmp_path / "epp_replicas.json").read_text())
    assert summary["epp_replicas"] == [1, 2]
    assert summary["policies"]["default"]["1"]["swaps_vs_first"] in (1.0, None)
    assert set(summary["policies"]["round-robin"]) == {"1", "2"}
    assert (tmp_path / "epp_replicas.png").stat().st_size > 0


def test_cli_runs_replicas_without_the_exchange_when_asked(tmp_path: Path) -> None:
    argv = [
        "bench",
        "--scenario",
        "brief",
        "--policies",
        "default",
        "--duration",
        "20s",
        "--epp-replicas",
        "2",
    ]
    code = main(
        [*argv, "--epp-peers=false", "--replica-search=false", "--progress=false", "--out", str(tmp_path)]
    )
    assert code == 0
    doc = json.loads((tmp_path / "results.json").read_text())
    assert (doc["scenario"]["epp_replicas"], doc["scenario"]["epp_peers"]) == (2, False)


def test_cli_compares_a_config_file_as_the_policy_config(tmp_path: Path) -> None:
    example = Path(__file__).resolve().parents[4] / "examples" / "strict-priority.yaml"
    argv = ["bench", "--scenario", "brief", "--duration", "20s", "--config-file", str(example)]
    code = main(
        [
            *argv,
            "--policies",
            "default,config",
            "--replica-search=false",
            "--progress=false",
            "--out",
            str(tmp_path),
        ]
    )
    assert code == 0
    doc = json.loads((tmp_path / "results.json").read_text())
    assert set(doc["policies"]) == {"default", "config"}


@pytest.mark.parametrize(
    ("argv", "error"),
    [
        (["--config-file", "/no/such.yaml"], "--config-file"),
        (["--scenario", "nope"], "unknown scenario"),
        (["--policies", "default,best"], "unknown policies best"),
        (["--trace", "/no/such.csv"], "neither a packaged trace nor a file"),
        (["--adapters", "0"], "--adapters"),
        (["--epp-replicas", "1,x"], "counts such as 1,2,4"),
        (["--epp-replicas", "2,2"], "distinct counts"),
    ],
    ids=["config-file", "scenario", "policy", "trace", "adapters", "epp-replicas-word", "epp-replicas-twice"],
)
def test_cli_bad_input_exits_2_with_a_message(
    argv: list[str], error: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["bench", *argv]) == 2
    assert error in capsys.readouterr().err


@pytest.mark.parametrize(
    ("reduction", "text"),
    [(0.65, "65.0% lower"), (-0.2, "20.0% higher"), (None, "-")],
    ids=["lower", "higher", "undefined"],
)
def test_change_wording(reduction: float | None, text: str) -> None:
    assert report._fmt_change(reduction) == text
