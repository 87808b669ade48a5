"""Tenants, floods and priority mixes in `epp bench`: the scenario keys, the generators, the
figures, and short end-to-end runs of the `tenant-flood` and `priority-mix` scenarios."""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from epp.errors import ConfigError
from epp.tools.bench import report, runner, scenario, workload
from epp.tools.bench.events import RunResult, simulate
from epp.tools.bench.model import SimRequest

# -- scenario keys ------------------------------------------------------------------------------


def _doc(**extra: Any) -> dict[str, Any]:
    document: dict[str, Any] = {
        "name": "t",
        "duration_s": 100,
        "adapters": {"count": 4, "popularity": "zipf"},
        "arrivals": {"rate_rps": 10},
    }
    document.update(extra)
    return document


PRIORITIES: list[dict[str, Any]] = [
    {"objective": "critical", "priority": 10, "share": 0.2},
    {"objective": "standard", "priority": 0, "share": 0.5},
    {"objective": "sheddable", "priority": -10, "share": 0.3},
]


def test_the_new_scenarios_load() -> None:
    flood = scenario.load("tenant-flood")
    assert flood.workload.tenants == workload.Tenants(by_adapter=True)
    assert flood.workload.flood is not None and flood.workload.flood.factor == 10
    assert flood.workload.flood.duration_s == 60
    mix = scenario.load("priority-mix")
    assert [(c.objective, c.priority) for c in mix.workload.priorities] == [
        ("critical", 10),
        ("standard", 0),
        ("sheddable", -10),
    ]
    assert sum(c.share for c in mix.workload.priorities) == pytest.approx(1.0)


def test_valid_keys_parse() -> None:
    sc = scenario.parse(
        _doc(
            tenants={"count": 12},
            flood={"adapter": "adapter-001", "factor": 5, "at_s": 20, "duration_s": 30},
            priorities=PRIORITIES,
        )
    )
    spec = sc.workload
    assert spec.tenants == workload.Tenants(count=12)
    assert spec.tenants.names()[0] == "tenant-00" and len(spec.tenants.names()) == 12
    assert spec.flood == workload.Flood(adapter=1, factor=5.0, at_s=20.0, duration_s=30.0)
    assert spec.flood_adapter == "adapter-001"
    assert len(spec.priorities) == 3
    by_index = scenario.parse(_doc(flood={"adapter": 3, "factor": 10, "at_s": 0, "duration_s": 1000}))
    assert by_index.workload.flood_adapter == "adapter-003"
    plain = scenario.parse(_doc())
    assert (plain.workload.tenants, plain.workload.flood, plain.workload.priorities) == (None, None, ())


FLOOD = {"adapter": 1, "factor": 10, "at_s": 20, "duration_s": 30}


def _with(base: Mapping[str, Any], **changes: Any) -> dict[str, Any]:
    out = dict(base)
    out.update(changes)
    return out


def _drop(base: Mapping[str, Any], key: str) -> dict[str, Any]:
    return {k: v for k, v in base.items() if k != key}


def _priorities(**changes: Any) -> list[dict[str, Any]]:
    return [_with(PRIORITIES[0], **changes), *PRIORITIES[1:]]


INVALID: list[tuple[dict[str, Any], str]] = [
    ({"tenant": {"by": "adapter"}}, "unknown keys: tenant"),
    ({"tenants": {"by": "tenant"}}, "tenants.by must be adapter"),
    ({"tenants": {"count": 0}}, "tenants.count must be at least 1"),
    ({"tenants": {"count": 2.5}}, "tenants.count must be an integer"),
    ({"tenants": {"count": 2, "by": "adapter"}}, r"tenants must be \{by: adapter\} or \{count: N\}"),
    ({"tenants": {"size": 2}}, r"tenants must be \{by: adapter\} or \{count: N\}"),
    ({"tenants": 3}, r"tenants must be \{by: adapter\} or \{count: N\}"),
    ({"flood": _drop(FLOOD, "factor")}, "flood must be"),
    ({"flood": _with(FLOOD, rate=3)}, "flood must be"),
    ({"flood": [FLOOD]}, "flood must be"),
    ({"flood": _with(FLOOD, adapter=4)}, "index 4 is outside 0..3"),
    ({"flood": _with(FLOOD, adapter=-1)}, "index -1 is outside 0..3"),
    ({"flood": _with(FLOOD, adapter="adapter-9")}, "'adapter-9' is not one of the workload's adapters"),
    ({"flood": _with(FLOOD, adapter=True)}, "flood.adapter must be an integer"),
    ({"flood": _with(FLOOD, factor=0.5)}, "flood.factor must be at least 1"),
    ({"flood": _with(FLOOD, factor="ten")}, "flood.factor must be a number"),
    ({"flood": _with(FLOOD, at_s=-1)}, "at_s ≥ 0 and duration_s > 0"),
    ({"flood": _with(FLOOD, duration_s=0)}, "at_s ≥ 0 and duration_s > 0"),
    ({"flood": _with(FLOOD, at_s=100)}, "must be before the end of the run"),
    ({"priorities": {"critical": 10}}, "priorities must be a non-empty list"),
    ({"priorities": []}, "priorities must be a non-empty list"),
    ({"priorities": [_drop(PRIORITIES[0], "share")]}, r"priorities\[0\] must be"),
    ({"priorities": [_with(PRIORITIES[0], weight=1)]}, r"priorities\[0\] must be"),
    ({"priorities": _priorities(objective="")}, r"priorities\[0\].objective must be a non-empty name"),
    ({"priorities": _priorities(priority="high")}, r"priorities\[0\].priority must be an integer"),
    ({"priorities": _priorities(priority=1.5)}, r"priorities\[0\].priority must be an integer"),
    ({"priorities": _priorities(share=0)}, r"priorities\[0\].share must be in \(0, 1\]"),
    ({"priorities": _priorities(share=float("nan"))}, r"priorities\[0\].share must be a number"),
    ({"priorities": _priorities(share=0.3)}, "shares must sum to 1 \\(they sum to 1.1\\)"),
    ({"priorities": _priorities(objective="standard")}, "an objective is named twice"),
]


@pytest.mark.parametrize(("extra", "message"), INVALID, ids=[m for _, m in INVALID])
def test_invalid_keys_and_values_are_errors(extra: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        scenario.parse(_doc(**extra))


def test_a_flood_cannot_straddle_a_popularity_shift() -> None:
    adapters = {"count": 4, "popularity": "zipf", "shift": {"at_s": 40, "rotate": 1}}
    with pytest.raises(ValueError, match="straddle"):
        scenario.parse(_doc(adapters=adapters, flood=FLOOD))


def test_a_bad_file_is_a_config_error(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("name: bad\ntenants: {count: -2}\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=r"bad\.yaml: tenants\.count must be at least 1"):
        scenario.load(str(path))


def test_overrides_that_leave_the_flood_outside_are_errors() -> None:
    sc = scenario.load("tenant-flood")
    with pytest.raises(ConfigError, match=r"flood\.at_s \(90\) must be before the end"):
        sc.with_overrides(duration_s=60)
    with pytest.raises(ConfigError, match="index 2 is outside"):
        sc.with_overrides(adapters=2)
    assert sc.with_overrides(duration_s=120).workload.flood == sc.workload.flood


# -- generators ---------------------------------------------------------------------------------


def _spec(**changes: Any) -> workload.WorkloadSpec:
    base = workload.WorkloadSpec(
        duration_s=200.0,
        adapters=workload.adapter_names(5),
        popularity=workload.zipf_weights(5, 1.0),
        rate_rps=20.0,
    )
    return dataclasses.replace(base, **changes)


def _key(r: SimRequest) -> tuple[float, str, int, int]:
    return (r.arrival_s, r.adapter, r.prompt_tokens, r.output_tokens)


def test_the_flood_adds_the_right_number_of_arrivals_in_its_window() -> None:
    flood = workload.Flood(adapter=1, factor=10.0, at_s=50.0, duration_s=60.0)
    plain, flooded = _spec(), _spec(flood=flood)
    expected = 9 * workload.normal_rate_rps(plain, 1, 50.0) * 60.0  # (factor − 1) × rate × window
    assert expected == pytest.approx(9 * 20 * workload.zipf_weights(5, 1.0)[1] * 60)
    for seed in range(5):
        base = workload.generate(plain, seed)
        both = workload.generate(flooded, seed)
        # The base stream is untouched: every original request is still there, as it was.
        base_keys = Counter(_key(r) for r in base)
        extra = Counter(_key(r) for r in both) - base_keys
        assert sum(extra.values()) == len(both) - len(base)
        assert not base_keys - Counter(_key(r) for r in both)
        times = [k[0] for k in extra.elements()]
        assert all(50.0 <= t < 110.0 for t in times)
        assert {k[1] for k in extra} == {"adapter-001"}
        # Poisson: within 5 standard deviations of the mean.
        assert abs(len(times) - expected) < 5 * math.sqrt(expected)
        # One ordered, re-indexed stream; the same seed gives the same list.
        assert [r.index for r in both] == list(range(len(both)))
        assert all(a.arrival_s <= b.arrival_s for a, b in itertools.pairwise(both))
        assert [_key(r) for r in workload.generate(flooded, seed)] == [_key(r) for r in both]


def test_a_flood_past_the_end_of_the_run_is_cut_there() -> None:
    flood = workload.Flood(adapter=0, factor=3.0, at_s=190.0, duration_s=60.0)
    requests = workload.generate(_spec(flood=flood), 3)
    assert max(r.arrival_s for r in requests) < 200.0


def test_the_priority_draw_follows_the_shares() -> None:
    classes = tuple(workload.PriorityClass(p["objective"], p["priority"], p["share"]) for p in PRIORITIES)
    requests = workload.generate(_spec(duration_s=1000.0, priorities=classes), 7)
    n = len(requests)
    counts = Counter(r.objective for r in requests)
    for c in classes:
        sd = math.sqrt(n * c.share * (1 - c.share))
        assert abs(counts[c.objective] - n * c.share) < 5 * sd, (c, counts)


def test_tenants_by_adapter_and_by_count() -> None:
    by_adapter = workload.generate(_spec(base_fraction=0.2, tenants=workload.Tenants(by_adapter=True)), 1)
    assert all(r.tenant == (r.adapter or workload.BASE_TENANT) for r in by_adapter)
    drawn = workload.generate(_spec(duration_s=1000.0, tenants=workload.Tenants(count=4)), 1)
    counts = Counter(r.tenant for r in drawn)
    assert set(counts) == {"tenant-00", "tenant-01", "tenant-02", "tenant-03"}
    assert max(counts.values()) - min(counts.values()) < 5 * math.sqrt(len(drawn) / 4)


def test_tenants_and_priorities_leave_the_base_stream_alone() -> None:
    classes = (workload.PriorityClass("a", 1, 0.5), workload.PriorityClass("b", 0, 0.5))
    plain = workload.generate(_spec(), 11)
    dressed = workload.generate(_spec(tenants=workload.Tenants(count=3), priorities=classes), 11)
    assert [_key(r) for r in dressed] == [_key(r) for r in plain]
    assert all(r.tenant == "" and r.objective == "" for r in plain)


# -- figures ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        ([1.0, 1.0, 1.0], 1.0),
        ([1.0, 0.0, 0.0, 0.0], 0.25),
        ([0.5, 1.0], 0.9),
        ([0.2, 0.2], 1.0),
        ([0.0, 0.0], 1.0),
        ([], 1.0),
    ],
)
def test_jain_index(values: list[float], expected: float) -> None:
    assert runner.jain_index(values) == pytest.approx(expected)


def _served(index: int, arrival: float, ttft: float, *, wait: float = 0.0, **kw: Any) -> SimRequest:
    r = SimRequest(index, arrival, "adapter-000", 100, 10, **kw)
    r.dispatched_s = arrival + wait
    r.first_token_s = arrival + ttft
    r.finish_s = arrival + ttft + 1.0
    return r


def _refused(index: int, arrival: float, status: int, waited: float = 0.0, **kw: Any) -> SimRequest:
    r = SimRequest(index, arrival, "adapter-000", 100, 10, **kw)
    r.rejected = True
    r.refused_status = status
    r.refused_s = arrival + waited
    return r


def test_summary_figures_on_known_requests() -> None:
    requests = (
        _served(0, 5.0, 9.0, objective="hi", tenant="a"),  # warm-up: not measured
        _served(1, 10.0, 0.5, objective="hi", tenant="a"),
        _served(2, 11.0, 3.0, wait=2.5, objective="hi", tenant="b"),
        _refused(3, 12.0, 429, objective="lo", tenant="b"),
        _refused(4, 13.0, 503, waited=60.0, objective="lo", tenant="b"),
        _served(5, 14.0, 0.2, objective="lo", tenant="a"),
    )
    classes = (workload.PriorityClass("lo", -1, 0.5), workload.PriorityClass("hi", 5, 0.5))
    result = RunResult("p", 1, requests, {}, 30.0, 14.0, 0, 0)
    s = runner.summarize(result, warmup_s=10.0, slo_ttft_s=1.0, priorities=classes, flooding=frozenset({2}))
    assert (s.requests, s.rejected, s.refused_429, s.refused_503) == (5, 2, 1, 1)
    # waits: 0, 2.5, 0 (429 on arrival), 60 (a 503 when its TTL ran out), 0
    assert s.queue_wait_p50_s == 0.0
    assert s.queue_wait_p99_s == pytest.approx(2.5 + (60 - 2.5) * 0.96)
    hi, lo = s.by_priority  # highest priority first
    assert (hi.objective, hi.requests, hi.slo_goodput, hi.refused) == ("hi", 2, 0.5, 0)
    assert hi.ttft_p99_s == pytest.approx(0.5 + 2.5 * 0.99)
    assert (lo.objective, lo.requests, lo.slo_goodput, lo.refused) == ("lo", 3, 1 / 3, 2)
    assert lo.ttft_p99_s == pytest.approx(0.2)
    a, b = s.by_tenant
    assert (a.tenant, a.requests, a.slo_goodput) == ("a", 2, 1.0)
    assert (b.tenant, b.requests, b.slo_goodput) == ("b", 3, 0.0)
    assert s.jain_fairness == pytest.approx(0.5)
    assert s.flooding_ttft_p99_s == 3.0
    assert s.steady_ttft_p99_s == pytest.approx(0.2 + 0.3 * 0.99)
    json = s.as_json()
    assert json["jain_fairness"] == pytest.approx(0.5) and json["steady_flood_ratio"] is None
    assert isinstance(json["by_priority"], list) and json["by_priority"][0]["objective"] == "hi"


def test_a_request_still_queued_at_the_end_waits_forever() -> None:
    stuck = SimRequest(0, 1.0, "adapter-000", 100, 10)
    result = RunResult("p", 1, (stuck,), {}, 30.0, 1.0, 0, 0)
    assert math.isinf(runner.summarize(result, warmup_s=0.0, slo_ttft_s=1.0).queue_wait_p99_s)


# -- end to end ---------------------------------------------------------------------------------

# The whole scenario (300 s, past the queue's 60 s TTL, so Sheddable requests could time out): a
# shorter run's warm-up ends before the pool first saturates, while no pod's batch size is known
# yet, and that first second is then a large part of what is measured.
PRIORITY_RUN_S = 300.0
FLOOD_RUN_S = 160.0  # the flood (90–150 s) and 10 s after it


def _run(sc: scenario.Scenario, *, flow_control: bool) -> runner.PolicySummary:
    fleet = dataclasses.replace(runner.fleet_for(sc), flow_control=flow_control)
    result = simulate("default", fleet, workload.generate(sc.workload, sc.seed), seed=sc.seed)
    return runner.summarize_scenario(sc, result)


@pytest.fixture(scope="module")
def priority_runs() -> dict[bool, runner.PolicySummary]:
    sc = scenario.load("priority-mix").with_overrides(duration_s=PRIORITY_RUN_S)
    return {fc: _run(sc, flow_control=fc) for fc in (True, False)}


def _by_objective(summary: runner.PolicySummary) -> dict[str, runner.PriorityFigures]:
    return {p.objective: p for p in summary.by_priority}


def test_priority_mix_objectives_reach_the_epp(priority_runs: dict[bool, runner.PolicySummary]) -> None:
    # Without flow control, admission sheds by priority: Sheddable (< 0) goes first.
    legacy = _by_objective(priority_runs[False])
    assert legacy["sheddable"].refused > 10 * legacy["critical"].refused
    assert priority_runs[False].refused_429 > 0 and priority_runs[False].refused_503 == 0
    # With it, Sheddable is refused at once while the pool is saturated, and no request waits in the
    # EPP past the overload judge's target (500 ms) before it is dispatched or refused.
    queued = priority_runs[True]
    assert queued.refused_429 > 0 and queued.refused_503 == 0 and queued.queue_wait_p99_s <= 0.6
    assert {p.objective for p in queued.by_priority} == {"critical", "standard", "sheddable"}


def test_priority_mix_critical_goes_first_and_sheddable_absorbs_refusals(
    priority_runs: dict[bool, runner.PolicySummary],
) -> None:
    figures = _by_objective(priority_runs[True])
    assert figures["critical"].slo_goodput >= 0.99 and figures["critical"].ttft_p99_s <= 1.0
    assert figures["critical"].slo_goodput > figures["standard"].slo_goodput + 0.1
    assert figures["critical"].refused <= 0.01 * figures["critical"].requests
    assert figures["sheddable"].refused > 0
    assert figures["sheddable"].refused >= figures["standard"].refused + figures["critical"].refused


@pytest.fixture(scope="module")
def flood_runs() -> dict[str, runner.PolicySummary]:
    sc = scenario.load("tenant-flood").with_overrides(duration_s=FLOOD_RUN_S)
    calm = runner.without_flood(sc)
    fleet = runner.fleet_for(calm)
    calm_result = simulate("default", fleet, workload.generate(calm.workload, calm.seed), seed=calm.seed)
    return {
        "flood": _run(sc, flow_control=True),
        "no flood": runner.summarize_scenario(calm, calm_result, flood_adapter=sc.workload.flood_adapter),
        "flood, no flow control": _run(sc, flow_control=False),
    }


def test_tenant_flood_figures(flood_runs: dict[str, runner.PolicySummary]) -> None:
    flood, calm = flood_runs["flood"], flood_runs["no flood"]
    assert {t.tenant for t in flood.by_tenant} == {f"adapter-{i:03d}" for i in range(8)}
    flooding = next(t for t in flood.by_tenant if t.tenant == "adapter-002")
    assert flooding.requests > 3 * next(t for t in calm.by_tenant if t.tenant == "adapter-002").requests
    assert flood.jain_fairness is not None and 1 / 8 <= flood.jain_fairness <= 1.0
    # Without the flood the steady tenants are well inside the SLO; the flooding tenant feels its
    # own flood: a good part of its requests is refused, or what is served waits past the SLO.
    assert calm.steady_ttft_p99_s < 1.0
    assert flooding.refused > 0.1 * flooding.requests or flood.flooding_ttft_p99_s > 1.0
    assert math.isfinite(calm.flooding_ttft_p99_s)


def test_tenant_flood_steady_tenants_are_shielded(flood_runs: dict[str, runner.PolicySummary]) -> None:
    flood = flood_runs["flood"].steady_ttft_p99_s
    target = 1.5 * flood_runs["no flood"].steady_ttft_p99_s
    assert flood <= target or flood < flood_runs["flood, no flow control"].steady_ttft_p99_s


def test_run_bench_reports_the_new_figures() -> None:
    sc = scenario.load("tenant-flood").with_overrides(duration_s=100.0)
    result = runner.run_bench(sc, ["default"], search_replicas=False)
    summary = result.summaries["default"]
    assert math.isfinite(summary.steady_ttft_p99_no_flood_s) and summary.steady_flood_ratio is not None
    text = report.format_table(result)
    assert "queue p99" in text and "flood/no-flood" in text and "Jain's fairness index" in text
    assert "goodput" in text and "critical" not in text
    document = report.results_document(result, command="epp bench")
    assert document["scenario"]["flood"]["adapter"] == "adapter-002"
    assert document["policies"]["default"]["steady_ttft_p99_no_flood_s"] is not None
    markdown = report.markdown_report(result, command="epp bench", plots=[])
    assert "| policy | steady p99 | no flood | flood/no-flood | flooding p99 |" in markdown


def test_the_report_shows_per_priority_tables_only_with_priorities() -> None:
    sc = scenario.load("priority-mix").with_overrides(duration_s=40.0)
    text = report.format_table(runner.run_bench(sc, ["round-robin"], search_replicas=False))
    assert "critical (10) p99" in text and "sheddable (-10) p99" in text
    assert "jain" not in text and "flood/no-flood" not in text


def test_flood_arrivals_are_reproducible() -> None:
    a = workload.flood_arrivals(_spec(), workload.Flood(0, 2.0, 0.0, 10.0), np.random.default_rng([1, 1]))
    b = workload.flood_arrivals(_spec(), workload.Flood(0, 2.0, 0.0, 10.0), np.random.default_rng([1, 1]))
    assert np.array_equal(a, b)
