"""Memory under sustained overload: does what the EPP holds follow what waits, or what arrived?

Runs `priority-mix` through `epp bench`'s simulator at a multiple of its capacity (default 2×,
30 req/s on a fleet that keeps 15 within the SLO) for a simulated soak (default 10 minutes), with
the `default` policy, and samples, every `--every-s` simulated seconds, the bytes still held by
objects the picker's own code allocated (`tracemalloc`, filtered to `epp/picker/`: queues, the
routing ledger, the gate, the judge, request lives) and the process's RSS. The workload (every
request, made up front) and the simulated pods are the benchmark's, not the EPP's, and are not in
the first figure.

Run:  .venv/bin/python -m benchmarks.overload_memory [--factor 2] [--duration-s 600] [--every-s 30]

Prints one line per sample and the growth over the second half of the soak: the picker's bounded
caches fill first (the prefix index holds up to the pods' KV blocks of hashes, about 30 MiB for
priority-mix's four pods, and fills within the first two minutes), so growth after that is what
would grow without bound. Exits 1 when the picker's bytes grew by more than `--limit-mib` (20)
over it.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import tracemalloc

from epp.tools.bench import runner, scenario, workload
from epp.tools.bench.events import simulate

PICKER_FILES = "*/epp/picker/*"
CAPACITY_RPS = 15.0  # priority-mix's: the rate its fleet keeps within the SLO (its file's header)


def rss_mib() -> float:
    with open("/proc/self/status", encoding="ascii") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def picker_mib() -> float:
    snapshot = tracemalloc.take_snapshot().filter_traces([tracemalloc.Filter(True, PICKER_FILES)])
    return sum(stat.size for stat in snapshot.statistics("filename")) / 2**20


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--factor", type=float, default=2.0, help="offered load ÷ capacity")
    parser.add_argument("--duration-s", type=float, default=600.0, help="simulated arrival window")
    parser.add_argument("--every-s", type=float, default=30.0, help="simulated seconds between samples")
    parser.add_argument("--limit-mib", type=float, default=20.0, help="the growth allowed")
    args = parser.parse_args(argv)

    sc = scenario.load("priority-mix").with_overrides(duration_s=args.duration_s)
    sc = dataclasses.replace(
        sc, workload=dataclasses.replace(sc.workload, rate_rps=CAPACITY_RPS * args.factor)
    )
    requests = workload.generate(sc.workload, sc.seed)
    print(
        f"priority-mix at {CAPACITY_RPS * args.factor:g} req/s ({args.factor:g}× capacity), "
        f"{args.duration_s:g} s simulated, {len(requests)} requests, policy default",
        flush=True,
    )
    tracemalloc.start()
    samples: list[tuple[float, float, float]] = []
    next_at = [0.0]

    def sample(fraction: float) -> None:
        at = fraction * args.duration_s
        if at + 1e-9 < next_at[0]:
            return
        next_at[0] = at + args.every_s
        picker, rss = picker_mib(), rss_mib()
        samples.append((at, picker, rss))
        print(f"  t={at:6.0f}s  picker {picker:7.2f} MiB  rss {rss:7.1f} MiB", flush=True)

    result = simulate("default", runner.fleet_for(sc), requests, seed=sc.seed, progress=sample)
    summary = runner.summarize_scenario(sc, result)
    second_half = [s for s in samples if s[0] >= args.duration_s / 2] or samples
    first, last = second_half[0], second_half[-1]
    growth = last[1] - first[1]
    print(
        f"goodput {summary.slo_goodput:.1%}, P99 TTFT {summary.ttft_p99_s:.2f} s, "
        f"429s {summary.refused_429}, 503s {summary.refused_503}, "
        f"queue wait P99 {summary.queue_wait_p99_s:.2f} s"
    )
    print(
        f"picker memory {first[1]:.2f} → {last[1]:.2f} MiB (t={first[0]:.0f} → {last[0]:.0f} s): "
        f"{growth:+.2f} MiB; RSS {first[2]:.1f} → {last[2]:.1f} MiB ({last[2] - first[2]:+.1f})"
    )
    return 0 if growth <= args.limit_mib else 1


if __name__ == "__main__":
    sys.exit(main())
