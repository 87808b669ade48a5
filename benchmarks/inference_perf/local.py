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
`tests/integration/test_inference_perf.py` uses the same helpers for its smoke run.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import pathlib
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from typing import Any

import yaml

from epp.tools.envoy.bootstrap import RoutingMode
from epp.tools.localstack import LocalStack, SimOptions, StackOptions

HERE = pathlib.Path(__file__).resolve().parent
REPO_ROOT = HERE.parents[1]
EXAMPLE_CONFIG = HERE / "lora-mix.yaml"
INSTALL_SCRIPT = HERE / "install.sh"
DEFAULT_VENV = REPO_ROOT / ".venv-inference-perf"
BASE_MODEL = "meta-llama/Llama-3.1-8B-Instruct"
ADAPTERS = ("legal-lora-v1", "legal-lora-v2", "medical-lora", "sql-lora")  # the example's split
# Nothing may reach a model hub: the tokenizer is a local directory.
OFFLINE_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
ROUTING = [mode.value for mode in RoutingMode]  # epp, round-robin


def stack_options(
    pods: int,
    routing: RoutingMode = RoutingMode.EPP,
    *,
    max_cpu_loras: int = 4,
    epp_config: pathlib.Path | None = None,
) -> StackOptions:
    """Sims as `manifests/sim/deployment.yaml` runs them in the kind pool, every adapter registered.

    The kind pool keeps all four adapters in host memory (`max_cpu_loras` 4), so a swap costs
    milliseconds; 2 (vLLM's default, equal to the slots) makes every swap a 200 ms load from storage.
    """
    sim = SimOptions(
        base_model=BASE_MODEL,
        adapters=ADAPTERS,
        max_loras=2,
        max_cpu_loras=max_cpu_loras,
        max_num_seqs=16,
        lora_load_latency_s=0.2,
    )
    serve_args = ("--config-file", str(epp_config)) if epp_config is not None else ()
    return StackOptions(pods=pods, sim=sim, routing=routing, extra_serve_args=serve_args)


def build_tokenizer(venv: pathlib.Path, out: pathlib.Path, *, timeout_s: float = 120.0) -> None:
    """A tiny tokenizer in `out`, trained offline by the real-vLLM tier's model builder.

    inference-perf counts tokens with a Hugging Face tokenizer and would otherwise download the
    base model's (a gated one). The builder runs under the inference-perf virtualenv, whose
    transformers and tokenizers it needs; the project's own virtualenv has neither.
    """
    code = "import pathlib, sys\nfrom e2e.real_vllm.make_models import build_tokenizer\n"
    code += "build_tokenizer(pathlib.Path(sys.argv[1]))\n"
    result = subprocess.run(
        [str(venv / "bin" / "python"), "-c", code, str(out)],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        cwd=REPO_ROOT,
        env={**os.environ, **OFFLINE_ENV},
    )
    if result.returncode != 0 or not (out / "tokenizer.json").is_file():
        raise RuntimeError(f"building the tokenizer failed:\n{result.stderr[-3000:]}")


def loopback_config(
    gateway_url: str,
    tokenizer: pathlib.Path,
    reports: pathlib.Path,
    *,
    rate: float,
    duration_s: int,
    split: Mapping[str, float] | None = None,
) -> dict[str, Any]:
    """The example config with what a loopback run changes; `split` replaces the adapter weights."""
    config: dict[str, Any] = yaml.safe_load(EXAMPLE_CONFIG.read_text())
    config["server"]["base_url"] = gateway_url
    config["tokenizer"]["pretrained_model_name_or_path"] = str(tokenizer)
    config["data"]["input_distribution"].update(mean=64, std_dev=16, min=16, max=128)
    config["data"]["output_distribution"].update(mean=16, std_dev=4, min=8, max=32)
    load = config["load"]
    load["stages"] = [{"rate": rate, "duration": duration_s}]
    load["interval"] = 0
    load["num_workers"] = 1  # one load process beside Envoy, the EPP and the sims on 2 cores
    load["request_timeout"] = 10
    load["stage_teardown_grace_seconds"] = 5
    if split is not None:
        load["lora_traffic_split"] = [{"name": name, "split": weight} for name, weight in split.items()]
    config["storage"]["local_storage"]["path"] = str(reports)
    return config


def run_inference_perf(
    venv: pathlib.Path, config: Mapping[str, Any], workdir: pathlib.Path, *, timeout_s: float
) -> subprocess.CompletedProcess[str]:
    """One inference-perf run of `config` (written to `workdir`), offline, bounded by `timeout_s`."""
    path = workdir / "inference-perf.yaml"
    path.write_text(yaml.safe_dump(dict(config)))
    return subprocess.run(
        [str(venv / "bin" / "inference-perf"), "--config_file", str(path)],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        cwd=workdir,
        env={**os.environ, **OFFLINE_ENV},
    )


def read_report(reports: pathlib.Path, name: str) -> dict[str, Any]:
    """One of inference-perf's JSON reports, by file name."""
    path = reports / name
    if not path.is_file():
        raise FileNotFoundError(f"no {name} in {sorted(p.name for p in reports.iterdir())}")
    report: dict[str, Any] = json.loads(path.read_text())
    return report


@dataclasses.dataclass(frozen=True, slots=True)
class Figures:
    """What one report says about its requests: counts, and TTFT and end-to-end latency in seconds."""

    requests: int
    failures: int
    ttft_p50_s: float
    ttft_p99_s: float
    e2e_p50_s: float
    e2e_p99_s: float

    @classmethod
    def of(cls, report: Mapping[str, Any]) -> Figures:
        latency = report["successes"]["latency"]
        return cls(
            requests=report["successes"]["count"],
            failures=report["failures"]["count"],
            ttft_p50_s=latency["time_to_first_token"]["median"],
            ttft_p99_s=latency["time_to_first_token"]["p99"],
            e2e_p50_s=latency["request_latency"]["median"],
            e2e_p99_s=latency["request_latency"]["p99"],
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
        script = INSTALL_SCRIPT.relative_to(REPO_ROOT)
        print(f"no inference-perf in {args.venv}: run {script}", file=sys.stderr)
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
