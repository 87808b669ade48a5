"""inference-perf, the community's gateway benchmark, run for a few seconds through the local stack.

The example config `benchmarks/inference_perf/lora-mix.yaml` is what an operator points at a
real cluster; here the same file drives real Envoy, `epp serve` and three `epp sim` pods, with
only what a loopback run must change overridden (`testkit/inference_perf.py`: gateway URL,
a tokenizer built offline, one short stage) and an even adapter split. This keeps the example
honest (inference-perf rejects unknown keys, so a stale field fails here) and shows the two
tools agree: every request inference-perf reports for an adapter is one the EPP routed to it.

inference-perf needs Python ≥ 3.12 and lives in its own virtualenv (`$EPP_INFERENCE_PERF_VENV`,
default `.venv-inference-perf`), which CI makes with `benchmarks/inference_perf/install.sh`. The
test only uses it: without one it is skipped, naming the command that makes it.
"""

from __future__ import annotations

import collections
import json
import os
import pathlib
import urllib.request
from typing import Any

import pytest
import yaml

from epp.tools.localstack import LocalStack
from testkit import inference_perf

RUN_TIMEOUT_S = 90.0
STACK = inference_perf.stack_options(pods=3)  # the kind pool's sims: two LoRA slots each
# 15 req/s for 3 s: 45 requests, bounded by count and by time. With an even split the chance
# that some adapter gets none is 4 × 0.75^45 ≈ 1e-5; the example's 0.125 shares would make it
# a flake (≈ 1 in 200).
RATE = 15
DURATION_S = 3
EVEN_SPLIT = {name: 1 / len(inference_perf.ADAPTERS) for name in inference_perf.ADAPTERS}

# A run takes about 10 s plus the stack's start and the tokenizer's build.
pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]


@pytest.fixture(scope="module")
def inference_perf_venv() -> pathlib.Path:
    """The virtualenv with inference-perf in it; the test is skipped when there is none."""
    configured = pathlib.Path(os.environ.get("EPP_INFERENCE_PERF_VENV", ".venv-inference-perf"))
    if not os.access(configured / "bin" / "inference-perf", os.X_OK):
        pytest.skip(f"inference-perf not installed: {inference_perf.install_command(configured)}")
    return configured.absolute()  # inference-perf runs in a temporary directory


@pytest.fixture(scope="module")
def tokenizer_dir(
    inference_perf_venv: pathlib.Path, tmp_path_factory: pytest.TempPathFactory
) -> pathlib.Path:
    """The tiny offline tokenizer inference-perf counts tokens with (no model hub here)."""
    out = tmp_path_factory.mktemp("tokenizer")
    inference_perf.build_tokenizer(inference_perf_venv, out)
    return out


def _routed_by_adapter(stack: LocalStack) -> collections.Counter[str]:
    """Routing decisions answered 200, per target model, from the EPP's `/debug/decisions`."""
    url = f"http://127.0.0.1:{stack.epp_metrics_port}/debug/decisions"
    with urllib.request.urlopen(url, timeout=10) as response:
        decisions: list[dict[str, Any]] = json.loads(response.read())["decisions"]
    return collections.Counter(
        d["target_model"] for d in decisions if d["outcome"] == "routed" and d["response_status"] == 200
    )


def test_the_example_config_names_the_sample_adapters() -> None:
    """The loopback stack registers what the example splits over, as the kind pool does."""
    config = yaml.safe_load(inference_perf.EXAMPLE_CONFIG.read_text())
    assert [entry["name"] for entry in config["load"]["lora_traffic_split"]] == list(inference_perf.ADAPTERS)
    assert config["server"]["model_name"] == inference_perf.BASE_MODEL
    assert sum(entry["split"] for entry in config["load"]["lora_traffic_split"]) == 1.0


@pytest.mark.parametrize("own_stack", [STACK], indirect=True, ids=["epp"])
def test_inference_perf_lora_mix_through_the_gateway(
    inference_perf_venv: pathlib.Path,
    tokenizer_dir: pathlib.Path,
    own_stack: LocalStack,
    tmp_path: pathlib.Path,
) -> None:
    reports = tmp_path / "reports"
    config = inference_perf.loopback_config(
        own_stack.gateway_url, tokenizer_dir, reports, rate=RATE, duration_s=DURATION_S, split=EVEN_SPLIT
    )
    result = inference_perf.run_inference_perf(inference_perf_venv, config, tmp_path, timeout_s=RUN_TIMEOUT_S)
    assert result.returncode == 0, f"inference-perf failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"

    # Every request it sent succeeded through the gateway.
    summary = inference_perf.read_report(reports, "summary_lifecycle_metrics.json")
    sent = summary["load_summary"]["count"]
    assert sent >= RATE * DURATION_S * 0.8, summary["load_summary"]
    assert summary["failures"]["count"] == 0, summary["failures"]
    assert summary["successes"]["count"] == sent
    inference_perf.read_report(reports, "stage_0_lifecycle_metrics.json")

    # The per-adapter breakdown has each adapter of the split, and nothing else.
    per_adapter = {
        path.name for path in reports.glob("adapter_*_lifecycle_metrics.json") if "_stage_" not in path.name
    }
    assert per_adapter == {f"adapter_{name}_lifecycle_metrics.json" for name in inference_perf.ADAPTERS}
    reported: dict[str, int] = {}
    for name in inference_perf.ADAPTERS:
        figures = inference_perf.Figures.of(
            inference_perf.read_report(reports, f"adapter_{name}_lifecycle_metrics.json")
        )
        assert figures.failures == 0 and figures.requests > 0, (name, figures)
        assert 0 < figures.ttft_p50_s <= figures.e2e_p50_s, (name, figures)
        reported[name] = figures.requests
    assert sum(reported.values()) == sent

    # The EPP routed each of those requests as a request for its adapter: its decision log
    # (256 entries, more than this run sends) counts the same number per adapter.
    routed = _routed_by_adapter(own_stack)
    assert {name: routed[name] for name in inference_perf.ADAPTERS} == reported, routed

    # ... and routed by adapter: the sims (which, as vLLM does, put adapters registered at start
    # straight into a slot) loaded adapters never more often than the pool has LoRA slots, so no
    # adapter evicted another (round-robin routing: about 20 loads).
    loads = own_stack.adapter_loads()
    assert sum(loads.values()) <= STACK.pods * STACK.sim.max_loras, loads
