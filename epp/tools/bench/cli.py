"""`epp bench`: routing policies side by side on a scenario, in simulated time."""

from __future__ import annotations

import argparse
import dataclasses
import logging
import shlex
import sys
from pathlib import Path
from typing import TextIO

from epp.cliutil import add_bool_flag, parse_duration
from epp.errors import ConfigError
from epp.tools.bench import live, policies, report, runner, scenario

log = logging.getLogger(__name__)


def configure_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--scenario",
        default="brief",
        help=f"packaged scenario ({', '.join(scenario.packaged_names())}) or a scenario YAML file",
    )
    parser.add_argument(
        "--policies",
        default=parser_default_policies(),
        help="comma-separated policies to compare (default: all)",
    )
    parser.add_argument(
        "--config-file",
        type=Path,
        default=None,
        help="an EndpointPickerConfig to compare as the policy `config`, as `epp serve --config-file` "
        "runs it (add `config` to --policies when you give them)",
    )
    parser.add_argument("--seed", type=int, default=None, help="random seed (default: the scenario's)")
    parser.add_argument(
        "--trace", default=None, help="replay a CSV with TIMESTAMP, ContextTokens, GeneratedTokens"
    )
    parser.add_argument("--adapters", type=int, default=None, help="number of adapters")
    parser.add_argument("--zipf-alpha", type=float, default=None, help="Zipf popularity exponent")
    parser.add_argument("--replicas", type=int, default=None, help="replicas in the shared pool")
    parser.add_argument("--max-loras", type=int, default=None, help="GPU LoRA slots per replica")
    parser.add_argument(
        "--duration", type=parse_duration, default=None, help="simulated arrival window (e.g. 10m)"
    )
    parser.add_argument(
        "--scrape-interval", type=parse_duration, default=None, help="metrics scrape interval (e.g. 100ms)"
    )
    parser.add_argument(
        "--epp-replicas",
        default=None,
        help="active-active EPP replicas, each with its own scrapes and state; a list (1,2,4) runs each",
    )
    add_bool_flag(
        parser,
        "--epp-peers",
        default=True,
        help="active-active replicas exchange what they route every 100ms, as `epp serve --peers` does; "
        "false: each knows only its own routing and the scrapes",
    )
    parser.add_argument(
        "--epp-latency",
        type=parse_duration,
        default=None,
        help="time the EPP's path adds before each request reaches its pod (e.g. 10ms; default: the "
        "scenario's epp_latency_s, else 0), charged to every policy but round-robin and random",
    )
    add_bool_flag(parser, "--replica-search", default=True, help="search the fewest replicas meeting the SLO")
    parser.add_argument(
        "--search-duration",
        type=parse_duration,
        default=120.0,
        help="simulated window of each replica-search run (default 120s; capped by --duration)",
    )
    parser.add_argument("--out", type=Path, default=None, help="write report.md, results.json and plots here")
    add_bool_flag(parser, "--progress", default=True, help="progress bar on stderr")
    add_bool_flag(
        parser, "--live", default=False, help="also run a small scenario through real Envoy and sims"
    )


class ProgressBar:
    """One line on stderr, redrawn in place: policy, phase, bar."""

    def __init__(self, stream: TextIO, total_policies: int) -> None:
        self._stream = stream
        self._total = total_policies
        self._done: list[str] = []
        self._width = 30

    def __call__(self, policy: str, phase: str, fraction: float) -> None:
        filled = int(self._width * min(1.0, max(0.0, fraction)))
        bar = "#" * filled + "." * (self._width - filled)
        index = len(self._done) + 1 if policy not in self._done else self._done.index(policy) + 1
        self._stream.write(f"\r[{index}/{self._total}] {policy:<12} {phase:<15} [{bar}] {fraction:4.0%}")
        self._stream.flush()
        if phase == "run" and fraction >= 1.0 and policy not in self._done:
            self._done.append(policy)

    def close(self) -> None:
        self._stream.write("\n")
        self._stream.flush()


def run(args: argparse.Namespace) -> int:
    try:
        if args.config_file is not None:
            try:
                text = args.config_file.read_text(encoding="utf-8")
            except OSError as exc:
                raise ConfigError(f"--config-file: {exc}") from exc
            added = policies.add_config(text)
            if args.policies == parser_default_policies():
                args.policies = f"{args.policies},{added}"
        names = policies.parse_policies(args.policies)
        sc = scenario.load(args.scenario).with_overrides(
            adapters=args.adapters,
            zipf_alpha=args.zipf_alpha,
            replicas=args.replicas,
            max_loras=args.max_loras,
            duration_s=args.duration,
            trace=args.trace,
            seed=args.seed,
            scrape_interval_s=args.scrape_interval,
            epp_latency_s=args.epp_latency,
        )
        if args.search_duration <= 0:
            raise ConfigError("--search-duration must be positive")
        epp_counts = parse_counts(args.epp_replicas) if args.epp_replicas else [sc.epp_replicas]
    except ConfigError as exc:
        print(f"epp bench: {exc}", file=sys.stderr)
        return 2
    command = (
        "epp bench " + " ".join(shlex.quote(a) for a in sys.argv[2:]) if sys.argv[1:2] == ["bench"] else ""
    )
    results: dict[int, runner.BenchResult] = {}
    for count in epp_counts:
        scn = sc.with_overrides(epp_replicas=count, epp_peers=args.epp_peers)
        bar = ProgressBar(sys.stderr, len(names)) if args.progress else None
        results[count] = runner.run_bench(
            scn,
            names,
            search_replicas=args.replica_search,
            progress=bar,
            search_scenario=_search_scenario(scn, args.search_duration),
        )
        if bar is not None:
            bar.close()
        if len(epp_counts) > 1:
            print(f"\n{count} EPP replica{'s' if count > 1 else ''}")
        print(report.format_table(results[count]))
    if args.live:
        for count in epp_counts:
            code = live.run_live(sc.with_overrides(epp_replicas=count), names, out=sys.stdout)
            if code != 0:
                return code
    if args.out is not None:
        command = command or f"epp bench --scenario {sc.name}"
        if len(results) == 1:
            written = report.write_outputs(results[epp_counts[0]], args.out, command=command)
        else:
            written = report.write_replica_outputs(results, args.out, command=command)
        print(f"wrote {', '.join(str(p) for p in written)}")
    return 0


def parser_default_policies() -> str:
    return ",".join(policies.ALL_POLICIES)


def parse_counts(text: str) -> list[int]:
    """`1,2,4` → [1, 2, 4]: each at least 1, none twice."""
    try:
        counts = [int(part) for part in text.split(",") if part.strip()]
    except ValueError as exc:
        raise ConfigError(f"--epp-replicas takes counts such as 1,2,4, not {text!r}") from exc
    if not counts or min(counts) < 1 or len(set(counts)) != len(counts):
        raise ConfigError("--epp-replicas takes distinct counts of at least 1")
    return counts


def _search_scenario(sc: scenario.Scenario, search_duration_s: float) -> scenario.Scenario:
    """The scenario each replica-search run uses: the same workload over a shorter window."""
    duration = min(sc.workload.duration_s, search_duration_s)
    if duration >= sc.workload.duration_s:
        return sc
    return dataclasses.replace(
        sc,
        workload=dataclasses.replace(sc.workload, duration_s=duration),
        warmup_s=min(sc.warmup_s, duration / 10),
    )
