"""`epp bench --live`: a small scenario in real time through Envoy, `epp serve` and `epp sim` pods.

The same workload (arrivals, adapters, lengths; same seed) then runs in the simulator with a
pod profile matching `epp sim`'s flags, and both sets of figures are printed side by side. The
live run is small on purpose (a few hundred requests, tens of seconds per policy): it checks
that the simulator and the real stack agree on direction and rough size, not on milliseconds.
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
from collections.abc import Sequence
from typing import TextIO

import numpy as np

from epp.tools import loadgen
from epp.tools.bench import runner, workload
from epp.tools.bench.events import Fleet, simulate
from epp.tools.bench.model import PodConfig, PodProfile, SimRequest
from epp.tools.bench.scenario import Scenario
from epp.tools.localstack import LocalStack, SimOptions, StackError, StackOptions

LIVE_PODS = 4
LIVE_ADAPTERS = 5
LIVE_DURATION_S = 20.0
LIVE_RATE_RPS = 8.0
LIVE_MAX_TOKENS = 16
LIVE_SIM = SimOptions(
    max_loras=2,
    max_num_seqs=8,
    time_to_first_token_s=0.02,
    inter_token_latency_s=0.005,
    lora_load_latency_s=0.2,
)
REQUEST_TIMEOUT_S = 60.0
LIVE_POLICIES = ("default", "round-robin")


@dataclasses.dataclass(frozen=True, slots=True)
class LiveFigures:
    requests: int
    errors: int
    adapter_loads_per_1k: float
    ttft_p50_s: float
    e2e_p50_s: float
    e2e_p99_s: float


def _sim_profile() -> PodProfile:
    """`epp sim`'s cost model in this simulator's terms: fixed prefill step, fixed ITL, fixed load."""
    return PodProfile(
        name="epp-sim",
        step_base_s=LIVE_SIM.inter_token_latency_s,
        decode_s_per_seq=0.0,
        prefill_s_per_token=LIVE_SIM.time_to_first_token_s / 64,  # the live prompts are 64 tokens
        kv_capacity_tokens=1_000_000,
        adapter_bytes=0,
        lora_step_overhead_per_adapter=0.0,
        adapter_load_s=LIVE_SIM.lora_load_latency_s,
    )


def _workload(seed: int) -> list[SimRequest]:
    spec = workload.WorkloadSpec(
        duration_s=LIVE_DURATION_S,
        adapters=workload.adapter_names(LIVE_ADAPTERS),
        popularity=np.full(LIVE_ADAPTERS, 1.0 / LIVE_ADAPTERS),
        rate_rps=LIVE_RATE_RPS,
        prompt_tokens=(64, 64),
        output_tokens=(LIVE_MAX_TOKENS, LIVE_MAX_TOKENS),
    )
    return workload.generate(spec, seed)


def _simulated(policy: str, seed: int, epp_replicas: int) -> LiveFigures:
    requests = _workload(seed)
    fleet = Fleet(
        _sim_profile(),
        PodConfig(max_loras=LIVE_SIM.max_loras, max_num_seqs=LIVE_SIM.max_num_seqs),
        LIVE_PODS,
        scrape_interval_s=0.05,
        epp_replicas=epp_replicas,
        peer_interval_s=0.05,
    )
    result = simulate(policy, fleet, requests, seed=seed)
    summary = runner.summarize(result, warmup_s=0.0, slo_ttft_s=math.inf)
    loads = sum(c.loads_from_cpu + c.loads_from_disk for c in result.pods.values())
    return LiveFigures(
        requests=summary.requests,
        errors=summary.rejected + summary.unfinished,
        adapter_loads_per_1k=1000.0 * loads / max(1, summary.requests),
        ttft_p50_s=summary.ttft_p50_s,
        e2e_p50_s=summary.e2e_p50_s,
        e2e_p99_s=summary.e2e_p99_s,
    )


def _schedule(requests: list[SimRequest]) -> list[tuple[float, loadgen.Request]]:
    """Each request's arrival offset and the streamed completion a client sends then."""
    return [
        (
            r.arrival_s,
            loadgen.Request(
                {
                    "model": r.adapter,
                    "prompt": workload.prompt_text(r),
                    "max_tokens": r.output_tokens,
                    "stream": True,
                }
            ),
        )
        for r in requests
    ]


def _live(policy: str, seed: int, epp_replicas: int) -> LiveFigures:
    requests = _workload(seed)
    options = StackOptions(
        pods=LIVE_PODS,
        sim=dataclasses.replace(LIVE_SIM, adapters=workload.adapter_names(LIVE_ADAPTERS)),
        policy=policy,
        epp_replicas=epp_replicas,
    )
    with LocalStack(options, seed=seed) as stack:
        before = sum(stack.adapter_loads().values())
        results = asyncio.run(
            loadgen.open_loop((stack.gateway_url,), _schedule(requests), timeout_s=REQUEST_TIMEOUT_S)
        )
        loads = sum(stack.adapter_loads().values()) - before
    ok = [r for r in results if r.served]
    return LiveFigures(
        requests=len(requests),
        errors=len(requests) - len(ok),
        adapter_loads_per_1k=1000.0 * loads / max(1, len(requests)),
        ttft_p50_s=loadgen.percentile([t.ttft_s for t in ok], 0.50),
        e2e_p50_s=loadgen.percentile([t.e2e_s for t in ok], 0.50),
        e2e_p99_s=loadgen.percentile([t.e2e_s for t in ok], 0.99),
    )


def run_live(scenario: Scenario, policies: Sequence[str], *, out: TextIO) -> int:
    """Run the live cross-check for `default` and `round-robin` (those of `policies`); exit status.

    With `scenario.epp_replicas` above 1, that many `epp serve` processes run active-active
    (`--peers`) behind the one Envoy, whose EPP cluster has them all; stateless baselines
    run one (a round robin needs no peers).
    """
    chosen = [p for p in LIVE_POLICIES if p in policies] or list(policies[:1])
    replicas = scenario.epp_replicas
    out.write(
        f"\nlive cross-check: {LIVE_PODS} epp sim pods (max-loras {LIVE_SIM.max_loras}, max-num-seqs "
        f"{LIVE_SIM.max_num_seqs}), {LIVE_ADAPTERS} adapters, {LIVE_RATE_RPS:g} req/s for "
        f"{LIVE_DURATION_S:g}s through Envoy and {replicas} epp serve"
        f"{' replicas' if replicas > 1 else ''}, next to the simulator on the same workload\n"
    )
    out.write(
        f"{'policy':<12} {'run':<5} {'reqs':>5} {'errors':>6} {'loads/1k':>9} "
        f"{'ttft p50':>9} {'e2e p50':>9} {'e2e p99':>9}\n"
    )
    for policy in chosen:
        try:
            count = replicas if policy == "default" else 1
            live = _live(policy, scenario.seed, count)
        except StackError as exc:
            out.write(f"live stack failed to start: {exc}\n")
            return 1
        for label, fig in (("live", live), ("sim", _simulated(policy, scenario.seed, count))):
            out.write(
                f"{policy:<12} {label:<5} {fig.requests:>5} {fig.errors:>6} "
                f"{fig.adapter_loads_per_1k:>9.1f} {fig.ttft_p50_s * 1000:>7.0f}ms "
                f"{fig.e2e_p50_s * 1000:>7.0f}ms {fig.e2e_p99_s * 1000:>7.0f}ms\n"
            )
    return 0
