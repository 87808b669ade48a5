"""The example inference-perf config against a gateway on loopback, EPP routing vs round-robin.

Run:  .venv/bin/python -m benchmarks.inference_perf.local [--rate 8] [--duration 30] [--pods 3]
      [--max-cpu-loras 4] [--routing epp,round-robin] [--epp-config FILE] [--venv .venv-inference-perf]

`lora-mix.yaml` beside this file is written for a cluster's gateway. This runs the same file,
once per routing mode, against `epp.tools.localstack` (real Envoy and `epp serve` in front of
`epp sim` pods configured as the kind pool's: the four sample adapters, two LoRA slots per pod,
200 ms per adapter load), changing only what a loopback run must: the gateway URL, a tokenizer
built offline (`e2e/real_vllm/make_models.py`; no model hub here), a single stage at `--rate`
for `--duration`, and short prompts and outputs (the sims answer in milliseconds). It prints
inference-perf's per-adapter figures beside the pods' adapter loads, which is what the
per-adapter report is for: an aggregate P50 hides the adapters that pay for swaps.
inference-perf comes from `install.sh` beside this file (Python ≥ 3.12, its own virtualenv).
The helpers live in `testkit/inference_perf.py`, which the smoke test
`tests/integration/test_inference_perf.py` shares.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import sys
import tempfile
from collections.abc import Sequence

from epp.tools.envoy.bootstrap import RoutingMode
from epp.tools.localstack import LocalStack
from testkit.inference_perf import (
    ADAPTERS,
    DEFAULT_VENV,
    ROUTING,
    Figures,
    build_tokenizer,
    install_command,
    loopback_config,
    read_report,
    run_inference_perf,
    stack_options,
)


def _row(routing: str, what: str, f: Figures, loads: float) -> str:
    ms = [f"{value * 1000:.0f}ms" for value in (f.ttft_p50_s, f.ttft_p99_s, f.e2e_p50_s, f.e2e_p99_s)]
    cells = f"{routing:<12} {what:<14} {f.requests:>5} {f.failures:>5} "
    return cells + " ".join(f"{m:>9}" for m in ms) + f" {loads:>6.0f}"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--rate", type=float, default=8.0, help="requests per second (default 8)")
    parser.add_argument("--duration", type=int, default=30, help="seconds of load (default 30)")
    parser.add_argument("--pods", type=int, default=3, help="simulated pods (default 3)")
    parser.add_argument(
        "--max-cpu-loras",
        type=int,
        default=4,
        help="adapters each pod keeps in host memory (default 4, as kind)",
    )
    parser.add_argument("--routing", default="epp,round-robin", help="epp, round-robin or both (default)")
    parser.add_argument(
        "--epp-config",
        type=pathlib.Path,
        default=None,
        help="an EndpointPickerConfig for the EPP (`epp serve --config-file`; default: its `default` policy)",
    )
    parser.add_argument("--venv", type=pathlib.Path, default=DEFAULT_VENV, help="inference-perf's virtualenv")
    args = parser.parse_args(argv)
    modes = [part.strip() for part in args.routing.split(",") if part.strip()]
    if not modes or any(mode not in ROUTING for mode in modes):
        parser.error(f"--routing: a list of {', '.join(ROUTING)}")
    if not os.access(args.venv / "bin" / "inference-perf", os.X_OK):
        print(f"no inference-perf in {args.venv}: run {install_command(args.venv)}", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="inference-perf-local-") as tmp:
        work = pathlib.Path(tmp)
        build_tokenizer(args.venv, work / "tokenizer")
        header = f"{'routing':<12} {'adapter':<14} {'reqs':>5} {'fail':>5} "
        header += " ".join(f"{h:>9}" for h in ("ttft p50", "ttft p99", "e2e p50", "e2e p99")) + "  loads"
        print(header)
        failed = False
        for mode in modes:
            reports = work / f"reports-{mode}"
            with LocalStack(
                stack_options(
                    args.pods, RoutingMode(mode), max_cpu_loras=args.max_cpu_loras, epp_config=args.epp_config
                )
            ) as stack:
                config = loopback_config(
                    stack.gateway_url, work / "tokenizer", reports, rate=args.rate, duration_s=args.duration
                )
                result = run_inference_perf(args.venv, config, work, timeout_s=args.duration + 120)
                loads = stack.adapter_loads()
            if result.returncode != 0:
                print(f"{mode}: inference-perf failed:\n{result.stderr[-3000:]}", file=sys.stderr)
                failed = True
                continue
            for name in ADAPTERS:
                if not (reports / f"adapter_{name}_lifecycle_metrics.json").is_file():
                    # inference-perf writes no file for an adapter the draw never named (a short run)
                    print(f"{mode:<12} {name:<14} {0:>5}  (no requests drawn for it)")
                    continue
                figures = Figures.of(read_report(reports, f"adapter_{name}_lifecycle_metrics.json"))
                print(_row(mode, name, figures, loads.get(name, 0.0)))
                failed = failed or figures.failures > 0
            summary = Figures.of(read_report(reports, "summary_lifecycle_metrics.json"))
            print(_row(mode, "(all)", summary, sum(loads.values())))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
