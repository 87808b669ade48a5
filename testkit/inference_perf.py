"""The example inference-perf config run against a gateway on loopback: what the loopback
benchmark (`python -m benchmarks.inference_perf.local`) and its smoke test share.

`benchmarks/inference_perf/lora-mix.yaml` is written for a cluster's gateway; `loopback_config`
changes only what a loopback run must (gateway URL, an offline tokenizer, one stage, short
prompts and outputs), and `stack_options` starts sims configured as the kind pool's.
inference-perf lives in its own virtualenv (`install_command`, Python ≥ 3.12): nothing here
installs it.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import subprocess
from collections.abc import Mapping
from typing import Any

import yaml

from epp.tools.envoy.bootstrap import RoutingMode
from epp.tools.localstack import SimOptions, StackOptions

REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]
HERE = REPO_ROOT / "benchmarks" / "inference_perf"
EXAMPLE_CONFIG = HERE / "lora-mix.yaml"
INSTALL_SCRIPT = HERE / "install.sh"
DEFAULT_VENV = REPO_ROOT / ".venv-inference-perf"
BASE_MODEL = "meta-llama/Llama-3.1-8B-Instruct"
ADAPTERS = ("legal-lora-v1", "legal-lora-v2", "medical-lora", "sql-lora")  # the example's split
# Nothing may reach a model hub: the tokenizer is a local directory.
OFFLINE_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
ROUTING = [mode.value for mode in RoutingMode]  # epp, round-robin


def install_command(venv: pathlib.Path) -> str:
    """The command that puts inference-perf into `venv` (what CI runs)."""
    return f"bash {INSTALL_SCRIPT.relative_to(REPO_ROOT)} {venv}"


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
