"""GPU utilization of one dedicated deployment per adapter, measured on the pod model.

"Dedicated deployments average 20–40 % GPU utilization" is a statement about time: the share of
wall time a replica's GPU is working. The pod model has no kernels, so utilization here is the
share of the measured window in which a pod is stepping, i.e. the union of its requests'
[admitted, finished] intervals (a pod with a request in its batch runs steps back to back; one
with none is idle). A scenario that claims a utilization (seed-conditions) is checked with:

    python -m epp.tools.bench.utilization seed-conditions [--replicas 1]

which runs each adapter's share of the workload alone on its own deployment, as the report's
dedicated figure does, and prints every deployment's utilization and their mean.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable, Sequence

from epp.tools.bench import runner, scenario, workload
from epp.tools.bench.model import SimRequest


def busy_fraction(requests: Iterable[SimRequest], start_s: float, end_s: float) -> dict[str, float]:
    """Per pod: the share of [start_s, end_s] covered by its requests' [admitted, finished] spans."""
    spans: dict[str, list[tuple[float, float]]] = {}
    for r in requests:
        if not r.pod or r.admitted_s is None:
            continue
        finish = r.finish_s if r.finish_s is not None else end_s
        low, high = max(r.admitted_s, start_s), min(finish, end_s)
        if high > low:
            spans.setdefault(r.pod, []).append((low, high))
    return {pod: _covered(intervals) / (end_s - start_s) for pod, intervals in spans.items()}


def _covered(intervals: list[tuple[float, float]]) -> float:
    """Total length of the union of `intervals`."""
    total, reach = 0.0, float("-inf")
    for low, high in sorted(intervals):
        if high > reach:
            total += high - max(low, reach)
            reach = high
    return total


def dedicated_utilization(sc: scenario.Scenario, *, replicas: int = 1) -> dict[str, float]:
    """Each adapter's deployment (`replicas` pods, round robin, only its requests): mean busy share."""
    requests = workload.generate(sc.workload, sc.seed)
    end_s = sc.workload.duration_s
    out: dict[str, float] = {}
    for adapter in sorted({r.adapter for r in requests}):
        subset = [r for r in workload.generate(sc.workload, sc.seed) if r.adapter == adapter]
        run = runner.run_policy(sc, "round-robin", replicas=replicas, requests=subset)
        busy = busy_fraction(run.requests, sc.warmup_s, end_s)
        out[adapter or "base"] = sum(busy.values()) / replicas
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("scenario", help="packaged scenario name or YAML path")
    parser.add_argument("--replicas", type=int, default=1, help="replicas per dedicated deployment")
    args = parser.parse_args(argv)
    sc = scenario.load(args.scenario)
    figures = dedicated_utilization(sc, replicas=args.replicas)
    for adapter, share in figures.items():
        print(f"{adapter:<16} {share:6.1%}")
    print(f"{'mean':<16} {sum(figures.values()) / len(figures):6.1%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
