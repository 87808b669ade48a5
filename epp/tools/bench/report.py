"""Benchmark output: the terminal table, results.json, report.md and PNG plots (matplotlib Agg)."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from epp.tools.bench import seed_claim
from epp.tools.bench.runner import BenchResult, PolicySummary, cdf_points
from epp.tools.bench.scenario import Scenario
from epp.tools.bench.workload import Tenants

BASELINE = "round-robin"
OURS = "default"
RESULTS_SCHEMA_VERSION = 2


def _ratio(baseline: float, ours: float) -> float | None:
    """baseline / ours; None when undefined (0/0); inf when only ours is 0."""
    if ours == 0:
        return None if baseline == 0 else math.inf
    return baseline / ours


def _fmt_s(value: float) -> str:
    if math.isnan(value):
        return "-"
    if math.isinf(value):
        return "∞"
    return f"{value * 1000:.0f}ms" if value < 1 else f"{value:.2f}s"


def _fmt_ratio(value: float | None) -> str:
    if value is None:
        return "-"
    return "∞" if math.isinf(value) else f"{value:.1f}x"


def comparisons(result: BenchResult) -> dict[str, Any]:
    """Ours vs round-robin (when both ran) and the shared-vs-dedicated GPU figure."""
    s = result.summaries
    out: dict[str, Any] = {}
    if OURS in s and BASELINE in s:
        ours, rr = s[OURS], s[BASELINE]
        swap_ratio = _ratio(rr.swaps_per_1k, ours.swaps_per_1k)
        out["vs_round_robin"] = {
            "swap_ratio": None if swap_ratio is None or math.isinf(swap_ratio) else swap_ratio,
            "swap_ratio_unbounded": swap_ratio is not None and math.isinf(swap_ratio),
            "ttft_p50_reduction": _reduction(rr.ttft_p50_s, ours.ttft_p50_s),
            "e2e_p50_reduction": _reduction(rr.e2e_p50_s, ours.e2e_p50_s),
            "ttft_p99_reduction": _reduction(rr.ttft_p99_s, ours.ttft_p99_s),
        }
    if seed_claim.applies(result):
        f = seed_claim.seed_figures(result)
        out["seed_claim"] = {
            "swap_ratio": None if f.swap_ratio is None or math.isinf(f.swap_ratio) else f.swap_ratio,
            "swap_ratio_unbounded": f.swap_ratio is not None and math.isinf(f.swap_ratio),
            "adapter_hit_rate": f.adapter_hit_rate,
            "p50_latency_cut": f.p50_latency_cut,
            "gpu_cost_cut": f.gpu_cost_cut,
        }
    total = result.dedicated_total
    if result.dedicated is not None:
        shared = {name: summary.replicas_for_slo for name, summary in s.items()}
        ours_replicas = shared.get(OURS)
        out["dedicated"] = {
            "per_adapter_replicas": result.dedicated,
            "total_replicas": total,
            "shared_replicas_for_slo": shared,
            "replica_reduction": (
                None if total is None or ours_replicas is None else 1.0 - ours_replicas / total
            ),
        }
    return out


def _reduction(baseline: float, ours: float) -> float | None:
    """1 − ours/baseline: 0.65 means 65 % lower; None when either is not finite."""
    if not (math.isfinite(baseline) and math.isfinite(ours)) or baseline <= 0:
        return 1.0 if math.isinf(baseline) and math.isfinite(ours) else None
    return 1.0 - ours / baseline


def results_document(result: BenchResult, *, command: str) -> dict[str, Any]:
    sc = result.scenario
    return {
        "schema_version": RESULTS_SCHEMA_VERSION,
        "command": command,
        "scenario": {
            "name": sc.name,
            "description": sc.description,
            "model_profile": sc.profile.name,
            "deployment": sc.deployment,
            "replicas": sc.replicas,
            "max_loras": sc.pod_config.max_loras,
            "max_cpu_loras": sc.pod_config.max_cpu_loras,
            "adapters": len(sc.workload.adapters),
            "duration_s": sc.workload.duration_s,
            "warmup_s": sc.warmup_s,
            "seed": sc.seed,
            "scrape_interval_s": sc.scrape_interval_s,
            "slo_ttft_s": sc.slo.ttft_s,
            "slo_target_goodput": sc.slo.target_goodput,
            "epp_replicas": sc.epp_replicas,
            "epp_peers": sc.epp_peers,
            "tenants": _tenants_json(sc.workload.tenants),
            "flood": _flood_json(sc),
            "priorities": [
                {"objective": c.objective, "priority": c.priority, "share": c.share}
                for c in sc.workload.priorities
            ],
        },
        "swaps_floor_per_1k": result.swaps_floor_per_1k,
        "policies": {name: summary.as_json() for name, summary in result.summaries.items()},
        "comparisons": comparisons(result),
    }


def _tenants_json(tenants: Tenants | None) -> dict[str, Any] | None:
    if tenants is None:
        return None
    return {"by": "adapter"} if tenants.by_adapter else {"count": tenants.count}


def _flood_json(sc: Scenario) -> dict[str, Any] | None:
    flood = sc.workload.flood
    if flood is None:
        return None
    return {
        "adapter": sc.workload.flood_adapter,
        "factor": flood.factor,
        "at_s": flood.at_s,
        "duration_s": flood.duration_s,
    }


_COLUMNS = (
    ("policy", 12),
    ("reqs", 7),
    ("swaps/1k", 9),
    ("vs floor", 8),
    ("vs rr", 6),
    ("adapter hit", 11),
    ("slot wait", 9),
    ("prefix hit", 10),
    ("ttft p50", 9),
    ("ttft p99", 9),
    ("floor p50/p99", 13),
    ("e2e p50", 8),
    ("e2e p99", 8),
    ("rps", 6),
    ("goodput", 7),
    ("shed", 6),
    ("replicas", 8),
)


def table_rows(result: BenchResult) -> list[list[str]]:
    rr = result.summaries.get(BASELINE)
    rows = []
    for name, s in result.summaries.items():
        vs = _fmt_ratio(_ratio(rr.swaps_per_1k, s.swaps_per_1k)) if rr is not None else "-"
        rows.append(
            [
                name,
                str(s.requests),
                f"{s.swaps_per_1k:.1f}",
                _fmt_vs_floor(s),
                vs,
                f"{s.adapter_hit_rate:.1%}",
                f"{s.slot_wait_rate:.1%}",
                f"{s.prefix_hit_rate:.1%}",
                _fmt_s(s.ttft_p50_s),
                _fmt_s(s.ttft_p99_s),
                f"{_fmt_s(s.ttft_floor_p50_s)}/{_fmt_s(s.ttft_floor_p99_s)}",
                _fmt_s(s.e2e_p50_s),
                _fmt_s(s.e2e_p99_s),
                f"{s.throughput_rps:.1f}",
                f"{s.slo_goodput:.1%}",
                str(s.rejected),
                "-" if s.replicas_for_slo is None else str(s.replicas_for_slo),
            ]
        )
    return rows


def _fmt_vs_floor(summary: PolicySummary) -> str:
    """Swaps as a multiple of the floor; "-" when neither swaps, "∞" when only the policy does."""
    if summary.swaps_vs_floor is not None:
        return f"{summary.swaps_vs_floor:.2f}x"
    return "-" if summary.swaps_per_1k == 0 else "∞"


def _text_table(header: Sequence[str], rows: Sequence[Sequence[str]], min_widths: Sequence[int]) -> list[str]:
    widths = [max(w, len(h)) for h, w in zip(header, min_widths, strict=True)]
    for row in rows:
        widths = [max(w, len(c)) for w, c in zip(widths, row, strict=True)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True))]
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) for row in rows]
    return lines


def format_table(result: BenchResult) -> str:
    lines = _text_table([n for n, _ in _COLUMNS], table_rows(result), [w for _, w in _COLUMNS])
    lines += _comparison_lines(result)
    if seed_claim.applies(result):
        header = seed_claim.SEED_HEADER
        lines += ["", "The seed's claim beside ours:"]
        lines += _text_table(header, seed_claim.seed_rows(result), [len(h) for h in header])
        lines.append(seed_claim.conditions(result))
    for header, rows in flow_tables(result):
        lines += ["", *_text_table(header, rows, [len(h) for h in header])]
    legend = flow_legend(result)
    if legend:
        lines += ["", *legend]
    return "\n".join(lines)


# -- flow control: queue wait, refusals, priorities, tenants -------------------------------


def _fmt_share(value: float | None) -> str:
    return "-" if value is None else f"{value:.1%}"


def flow_tables(result: BenchResult) -> list[tuple[list[str], list[list[str]]]]:
    """The tables under the main one: flow control per policy, then per priority and per tenant
    group when the scenario has them; each is (header, rows)."""
    workload = result.scenario.workload
    summaries = result.summaries
    tables: list[tuple[list[str], list[list[str]]]] = []
    header = ["policy", "queue p50", "queue p99", "429s", "503s"]
    rows = [
        [
            name,
            _fmt_s(s.queue_wait_p50_s),
            _fmt_s(s.queue_wait_p99_s),
            str(s.refused_429),
            str(s.refused_503),
        ]
        for name, s in summaries.items()
    ]
    if workload.tenants is not None:
        header.append("jain")
        for row, s in zip(rows, summaries.values(), strict=True):
            row.append("-" if s.jain_fairness is None else f"{s.jain_fairness:.3f}")
    tables.append((header, rows))
    if workload.priorities:
        header = ["policy"]
        for c in sorted(workload.priorities, key=lambda c: -c.priority):
            tag = f"{c.objective} ({c.priority})"
            header += [f"{tag} p99", "goodput", "refused"]
        rows = []
        for name, s in summaries.items():
            row = [name]
            for figures in s.by_priority:
                row += [_fmt_s(figures.ttft_p99_s), _fmt_share(figures.slo_goodput), str(figures.refused)]
            rows.append(row)
        tables.append((header, rows))
    if workload.flood is not None:
        header = ["policy", "steady p99", "no flood", "flood/no-flood", "flooding p99"]
        rows = [
            [
                name,
                _fmt_s(s.steady_ttft_p99_s),
                _fmt_s(s.steady_ttft_p99_no_flood_s),
                _fmt_ratio(s.steady_flood_ratio),
                _fmt_s(s.flooding_ttft_p99_s),
            ]
            for name, s in summaries.items()
        ]
        tables.append((header, rows))
    return tables


def flow_legend(result: BenchResult) -> list[str]:
    """What the flow-control figures mean (under their tables)."""
    workload = result.scenario.workload
    slo = result.scenario.slo.ttft_s
    lines = [
        "queue p50/p99: wait in the EPP's flow-control queues over measured requests (0 when never queued; "
        "a refused one until its refusal, one still queued at the end ∞); 429s/503s: requests the EPP "
        "refused (429: admission shedding or a full queue; 503: a queue's TTL)",
    ]
    if workload.priorities:
        lines.append(
            f"per objective: P99 TTFT over its served requests; goodput: the share of its measured requests "
            f"(refused ones included) with TTFT ≤ {slo:g}s; refused: its 429s and 503s"
        )
    if workload.tenants is not None:
        lines.append(
            "jain: Jain's fairness index over tenants' goodput x (each tenant's share of its measured "
            f"requests with TTFT ≤ {slo:g}s): (Σx)² / (n·Σx²), 1 = every tenant alike, "
            "1/n = one tenant gets it all"
        )
    flood = workload.flood
    if flood is not None:
        lines.append(
            f"flood: {workload.flood_adapter} at {flood.factor:g}× its rate from {flood.at_s:g}s for "
            f"{flood.duration_s:g}s; steady = the requests for every other adapter, "
            f"flooding = {workload.flood_adapter}'s; no flood = the steady requests' P99 in a run of the "
            "same scenario without the flood (target ≤ 1.5x)"
        )
    return lines


def _comparison_lines(result: BenchResult) -> list[str]:
    comp = comparisons(result)
    lines = []
    vs = comp.get("vs_round_robin")
    if vs:
        swap = (
            "no swaps at all vs round-robin's" if vs["swap_ratio_unbounded"] else _fmt_ratio(vs["swap_ratio"])
        )
        lines.append(
            f"default vs round-robin: swaps {swap} fewer"
            if not vs["swap_ratio_unbounded"]
            else f"default vs round-robin: {swap} {result.summaries[BASELINE].swaps_per_1k:.1f}/1k"
        )
        lines.append(
            f"  P50 TTFT {_fmt_change(vs['ttft_p50_reduction'])}, "
            f"P50 e2e {_fmt_change(vs['e2e_p50_reduction'])}, "
            f"P99 TTFT {_fmt_change(vs['ttft_p99_reduction'])}"
        )
    ded = comp.get("dedicated")
    if ded:
        per_adapter = [v for v in ded["per_adapter_replicas"].values() if v is not None]
        lines.append(
            f"dedicated (one deployment per adapter): {len(ded['per_adapter_replicas'])} deployments, "
            f"{ded['total_replicas'] if ded['total_replicas'] is not None else 'SLO not met'} replicas "
            f"(largest {max(per_adapter, default=0)}); shared default: "
            f"{ded['shared_replicas_for_slo'].get(OURS)} → {_fmt_pct(ded['replica_reduction'])} fewer"
        )
    sc = result.scenario
    lines.append(
        f"floor: {result.swaps_floor_per_1k:.1f} swaps/1k (one cache of all "
        f"{sc.replicas * sc.pod_config.max_loras} slots, furthest-next-use eviction); "
        "TTFT floor: the same policy with unlimited slots and free loads"
    )
    lines.append(
        f"SLO: TTFT ≤ {sc.slo.ttft_s:g}s for ≥ {sc.slo.target_goodput:.0%} of requests; "
        "replicas = fewest meeting it"
    )
    return lines


def _fmt_change(reduction: float | None) -> str:
    """0.65 → "65.0% lower"; −0.2 → "20.0% higher"."""
    if reduction is None:
        return "-"
    return f"{reduction:.1%} lower" if reduction >= 0 else f"{-reduction:.1%} higher"


def _fmt_pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.1%}"


def markdown_report(result: BenchResult, *, command: str, plots: Sequence[str]) -> str:
    sc = result.scenario
    header = [name for name, _ in _COLUMNS]
    lines = [
        f"# epp bench: {sc.name}",
        "",
        sc.description,
        "",
        f"Command: `{command}`",
        "",
        f"Model profile `{sc.profile.name}`, {sc.replicas} replicas, max-loras {sc.pod_config.max_loras}, "
        f"{len(sc.workload.adapters)} adapters, {sc.workload.duration_s:g} s simulated "
        f"(first {sc.warmup_s:g} s not measured), scrape every {sc.scrape_interval_s * 1000:g} ms, "
        f"seed {sc.seed}.",
        "",
        "| " + " | ".join(header) + " |",
        "|" + "---|" * len(header),
    ]
    lines += ["| " + " | ".join(row) + " |" for row in table_rows(result)]
    lines += ["", *(f"- {line.strip()}" for line in _comparison_lines(result)), ""]
    if seed_claim.applies(result):
        seed_header = seed_claim.SEED_HEADER
        lines += ["## The seed's claim beside ours", ""]
        lines += ["| " + " | ".join(seed_header) + " |", "|" + "---|" * len(seed_header)]
        lines += ["| " + " | ".join(row) + " |" for row in seed_claim.seed_rows(result)]
        lines += ["", seed_claim.conditions(result) + ".", ""]
    for table_header, rows in flow_tables(result):
        lines += ["| " + " | ".join(table_header) + " |", "|" + "---|" * len(table_header)]
        lines += ["| " + " | ".join(row) + " |" for row in rows]
        lines.append("")
    legend = flow_legend(result)
    if legend:
        lines += [*(f"- {line}" for line in legend), ""]
    lines += [f"![{Path(p).stem}]({Path(p).name})" for p in plots]
    return "\n".join(lines) + "\n"


def write_plots(result: BenchResult, out_dir: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths: list[Path] = []
    summaries: dict[str, PolicySummary] = result.summaries
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for name, s in summaries.items():
        for ax, samples in zip(axes, (s.ttft_samples_s, s.e2e_samples_s), strict=True):
            x, y = cdf_points(samples)
            if x.size:
                ax.step(x, y, where="post", label=name)
    for ax, title in zip(axes, ("TTFT", "end-to-end latency"), strict=True):
        ax.set_xscale("log")
        ax.set_xlabel("seconds (log)")
        ax.set_ylabel("fraction of requests")
        ax.set_title(f"{title} CDF — {result.scenario.name}")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    paths.append(_save(plt, fig, out_dir / "latency_cdf.png"))

    names = list(summaries)
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.bar(names, [summaries[n].swaps_per_1k for n in names], color="tab:orange")
    ax.set_ylabel("adapter swaps per 1k requests")
    ax.set_title(f"Adapter swaps — {result.scenario.name}")
    ax.tick_params(axis="x", rotation=30)
    paths.append(_save(plt, fig, out_dir / "swaps.png"))

    paths.append(_swaps_over_time(plt, result, out_dir / "swaps_over_time.png"))

    searched = {n: summaries[n].replicas_for_slo for n in names}
    if any(v is not None for v in searched.values()) or result.dedicated is not None:
        labels = list(names)
        values = [float(v) if v is not None else math.nan for v in searched.values()]
        if result.dedicated_total is not None:
            labels.append("dedicated")
            values.append(float(result.dedicated_total))
        fig, ax = plt.subplots(figsize=(7, 4))
        ax.bar(labels, values, color="tab:blue")
        ax.set_ylabel("fewest replicas meeting the TTFT SLO")
        ax.set_title(f"Replicas for SLO — {result.scenario.name} (missing: not met)")
        ax.tick_params(axis="x", rotation=30)
        paths.append(_save(plt, fig, out_dir / "replicas_for_slo.png"))
    return paths


def _swaps_over_time(plt: Any, result: BenchResult, path: Path) -> Path:
    """Cumulative swaps against arrival time, one line per policy, and the Belady floor's (dashed)."""
    start = result.scenario.warmup_s
    fig, ax = plt.subplots(figsize=(8, 4))
    for name, s in result.summaries.items():
        ax.step(
            [t - start for t in s.swap_times_s], range(1, len(s.swap_times_s) + 1), where="post", label=name
        )
    floor = result.floor_swap_times_s
    ax.step(
        [t - start for t in floor],
        range(1, len(floor) + 1),
        where="post",
        color="black",
        linestyle="--",
        label="floor (Belady)",
    )
    ax.set(xlabel="seconds after warm-up (arrival time)", ylabel="adapter swaps so far")
    ax.set_title(f"Swaps over time — {result.scenario.name}")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    return _save(plt, fig, path)


def _save(plt: Any, fig: Any, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_outputs(result: BenchResult, out_dir: Path, *, command: str) -> list[Path]:
    """results.json, report.md and the plots in `out_dir` (created); returns the files written."""
    out_dir.mkdir(parents=True, exist_ok=True)
    plots = write_plots(result, out_dir)
    results_path = out_dir / "results.json"
    results_path.write_text(
        json.dumps(results_document(result, command=command), indent=2, allow_nan=False) + "\n",
        encoding="utf-8",
    )
    report_path = out_dir / "report.md"
    report_path.write_text(
        markdown_report(result, command=command, plots=[str(p) for p in plots]), encoding="utf-8"
    )
    return [results_path, report_path, *plots]


def write_replica_outputs(results: Mapping[int, BenchResult], out_dir: Path, *, command: str) -> list[Path]:
    """Each EPP replica count's outputs in `epp-replicas-N/`, and swaps and P99 TTFT against N.

    `epp_replicas.json` holds, per policy, each count's swaps per 1k and P99 TTFT and their
    ratio to the first count's; `epp_replicas.png` plots them.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    for count, result in results.items():
        written += write_outputs(result, out_dir / f"epp-replicas-{count}", command=command)
    counts = list(results)
    first = results[counts[0]].summaries
    by_policy: dict[str, dict[str, Any]] = {}
    for policy in first:
        rows = {}
        for count in counts:
            summary = results[count].summaries[policy]
            rows[str(count)] = {
                "swaps_per_1k": summary.swaps_per_1k,
                "ttft_p99_s": _finite(summary.ttft_p99_s),
                "swaps_vs_first": _finite_ratio(summary.swaps_per_1k, first[policy].swaps_per_1k),
                "ttft_p99_vs_first": _finite_ratio(summary.ttft_p99_s, first[policy].ttft_p99_s),
            }
        by_policy[policy] = rows
    summary_path = out_dir / "epp_replicas.json"
    summary_path.write_text(
        json.dumps({"command": command, "epp_replicas": counts, "policies": by_policy}, indent=2) + "\n",
        encoding="utf-8",
    )
    written.append(summary_path)
    written.append(_plot_replicas(results, out_dir))
    return written


def _finite(value: float) -> float | None:
    return value if math.isfinite(value) else None


def _finite_ratio(value: float, first: float) -> float | None:
    if not (math.isfinite(value) and math.isfinite(first)) or first <= 0:
        return None
    return value / first


def _plot_replicas(results: Mapping[int, BenchResult], out_dir: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    counts = list(results)
    policies = list(results[counts[0]].summaries)
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for policy in policies:
        swaps = [results[n].summaries[policy].swaps_per_1k for n in counts]
        p99 = [results[n].summaries[policy].ttft_p99_s for n in counts]
        axes[0].plot(counts, swaps, marker="o", label=policy)
        axes[1].plot(counts, p99, marker="o", label=policy)
    axes[0].set_ylabel("adapter swaps per 1k requests")
    axes[1].set_ylabel("P99 TTFT (s, log)")
    axes[1].set_yscale("log")
    for ax in axes:
        ax.set_xlabel("EPP replicas")
        ax.set_xticks(counts)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"Active-active EPP replicas — {results[counts[0]].scenario.name}")
    return _save(plt, fig, out_dir / "epp_replicas.png")
