"""The scenarios that model the inference-perf loopback and the seed's conditions match their sources."""

from __future__ import annotations

from pathlib import Path

import pytest

from epp.errors import ConfigError
from epp.tools.bench import policies, runner, scenario, utilization
from epp.tools.bench.model import SimPod, SimRequest
from epp.tools.bench.sim_cost import SimLatencyProfile
from epp.tools.vllm_pod.lora import AdapterTier
from testkit import inference_perf


@pytest.mark.parametrize("name", ["cheap-swaps", "cheap-swaps-moderate"])
def test_cheap_swaps_is_the_loopbacks_pool(name: str) -> None:
    """Same pods, slots, host cache and sim latencies as `python -m benchmarks.inference_perf.local`."""
    sc = scenario.load(name)
    stack = inference_perf.stack_options(3, max_cpu_loras=4)
    assert sc.replicas == stack.pods
    assert sc.pod_config.max_loras == stack.sim.max_loras
    assert sc.pod_config.max_cpu_loras == 4 == len(sc.workload.adapters)
    assert sc.pod_config.max_num_seqs == stack.sim.max_num_seqs
    profile = sc.profile
    assert isinstance(profile, SimLatencyProfile)
    assert profile.load_s(AdapterTier.DISK) == pytest.approx(stack.sim.lora_load_latency_s)
    assert profile.latency.time_to_first_token_s == pytest.approx(stack.sim.time_to_first_token_s)
    assert profile.latency.inter_token_latency_s == pytest.approx(stack.sim.inter_token_latency_s)
    assert sorted(sc.workload.popularity) == pytest.approx([0.125, 0.125, 0.25, 0.5])


def test_sim_cost_prices_steps_as_epp_sim_does() -> None:
    profile = scenario.load("cheap-swaps").profile
    # one prefill step of a lone request: the fixed 20 ms; with a second adapter in the batch, × 1.1
    assert profile.step_s(0, 1, 64, 1) == pytest.approx(0.020)
    assert profile.step_s(0, 2, 64, 2) == pytest.approx(0.022)
    # decoding 11 sequences: 5 ms × (1 + 0.05 × 10)
    assert profile.step_s(11, 11, 0, 1) == pytest.approx(0.0075)
    assert profile.load_s(AdapterTier.CPU) == pytest.approx(0.002)


def test_the_unconstrained_floor_run_drops_sim_loads_and_slowdown() -> None:
    free = runner.unconstrained(scenario.load("cheap-swaps")).profile
    assert free.load_s(AdapterTier.DISK) == 0.0
    assert free.step_s(0, 2, 64, 2) == pytest.approx(0.020)


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("model: llama-3.1-8b-h100\nsim_cost: {}\n", "sim_cost replaces the model profile"),
        ("sim_cost: {ttft: 0.02}\n", "unknown keys in sim_cost: ttft"),
        ("sim_cost: {inter_token_latency_s: -1}\n", "must be ≥ 0"),
        ("sim_cost: 3\n", "sim_cost must be a mapping"),
    ],
    ids=["with-model", "unknown-key", "negative", "not-a-mapping"],
)
def test_bad_sim_cost_raises_config_error(tmp_path: Path, text: str, error: str) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=error):
        scenario.load(str(path))


def _served(pod: str, admitted: float, finished: float) -> SimRequest:
    request = SimRequest(index=0, arrival_s=admitted, adapter="a", prompt_tokens=8, output_tokens=8)
    request.pod, request.admitted_s, request.finish_s = pod, admitted, finished
    return request


def test_busy_fraction_is_the_union_of_request_spans_over_the_window() -> None:
    requests = [_served("p", 0.0, 4.0), _served("p", 2.0, 6.0), _served("q", 9.0, 20.0)]
    busy = utilization.busy_fraction(requests, start_s=1.0, end_s=11.0)
    assert busy == {"p": pytest.approx(0.5), "q": pytest.approx(0.2)}


def test_seed_conditions_dedicated_deployments_run_at_20_to_40_percent() -> None:
    sc = scenario.load("seed-conditions").with_overrides(duration_s=900.0)
    shares = utilization.dedicated_utilization(sc)
    assert len(shares) == 5
    assert 0.20 <= sum(shares.values()) / len(shares) <= 0.40


def test_cheap_swaps_pods_start_with_every_adapter_registered() -> None:
    """`lora_modules: all`, as the loopback's sims start: every adapter read into host memory, the
    last two registered holding the GPU slots, so a first use is a host copy, not a storage read."""
    sc = scenario.load("cheap-swaps")
    assert sc.pod_config.lora_modules == sc.workload.adapters
    pod = SimPod("p", sc.profile, sc.pod_config)
    assert sorted(pod.lora.cpu_adapters) == sorted(sc.workload.adapters)
    assert pod.lora.gpu_adapters == sc.workload.adapters[-2:]
    wider = sc.with_overrides(adapters=6)
    assert wider.pod_config.lora_modules == wider.workload.adapters  # `all` follows --adapters
    assert scenario.load("zipf-100").pod_config.lora_modules == ()  # absent: pods start empty


def test_lora_modules_takes_only_all(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("pods: {lora_modules: [a, b]}\n")
    with pytest.raises(ConfigError, match="lora_modules must be `all`"):
        scenario.load(str(path))


def _ttft_p50(sc: scenario.Scenario, policy: str) -> float:
    run = runner.run_policy(sc, policy)
    return runner.summarize_scenario(sc, run).ttft_p50_s


def test_the_epps_latency_is_charged_to_the_policies_it_runs() -> None:
    """`epp_latency_s` delays every request an EPP routes by that much before its pod sees it;
    round robin is the gateway's own balancing and pays nothing."""
    sc = scenario.load("cheap-swaps").with_overrides(duration_s=60.0)
    slow = sc.with_overrides(epp_latency_s=0.010)
    assert _ttft_p50(slow, "default") == pytest.approx(_ttft_p50(sc, "default") + 0.010, abs=0.002)
    assert _ttft_p50(slow, "round-robin") == _ttft_p50(sc, "round-robin")
    with pytest.raises(ConfigError, match="--epp-latency must not be negative"):
        sc.with_overrides(epp_latency_s=-1.0)


def test_the_host_memory_example_holds_round_robins_tail_on_cheap_swaps() -> None:
    """examples/host-memory-adapters.yaml is what its header says: on the loopback's pool at 8 req/s
    its P99 TTFT is within 2 % of round robin's, where `default`, which never learns that a load is
    cheap, is 40 % behind."""
    example = Path(__file__).parents[4] / "examples" / "host-memory-adapters.yaml"
    name = policies.add_config(example.read_text(encoding="utf-8"), "host-memory-example")
    sc = scenario.load("cheap-swaps")
    p99 = {
        policy: runner.summarize_scenario(sc, runner.run_policy(sc, policy)).ttft_p99_s
        for policy in (name, "round-robin", "default")
    }
    assert p99[name] <= 1.02 * p99["round-robin"]
    assert p99["default"] > 1.3 * p99["round-robin"]
