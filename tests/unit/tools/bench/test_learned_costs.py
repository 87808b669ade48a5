"""On the bench, the EPP learns the pod model's adapter-load costs from what it sees: each pick and
each request's time to first byte as the request finishes (what the access log gives `epp serve`)."""

from __future__ import annotations

import dataclasses

import pytest

from epp.picker.scheduling.build import build_scheduler
from epp.picker.scheduling.costs import CostEstimator
from epp.picker.scheduling.framework import ProfileScheduler
from epp.picker.scheduling.residency import ResidencyParams
from epp.picker.scheduling.scorers.predicted_ttft import PredictedTtftScorer
from epp.tools.bench import runner, scenario, workload
from epp.tools.bench.events import Fleet, simulate
from epp.tools.vllm_pod.lora import AdapterTier

ADAPTER_BYTES = 1_000_000_000  # large adapters: loads cost tens (host) to hundreds (storage) of ms
RATE_RPS = 3.0  # light load: a load's cost is not hidden behind a queue
DURATION_S = 200.0  # about 600 requests


def _learn(max_cpu_loras: int) -> tuple[CostEstimator, Fleet]:
    """zipf-100's workload on 4 pods at light load; the EPP's host-tier size set to the pods'."""
    sc = scenario.load("zipf-100").with_overrides(duration_s=DURATION_S, replicas=4)
    sc = dataclasses.replace(sc, workload=dataclasses.replace(sc.workload, rate_rps=RATE_RPS))
    fleet = runner.fleet_for(sc)
    fleet = dataclasses.replace(
        fleet,
        profile=dataclasses.replace(fleet.profile, adapter_bytes=ADAPTER_BYTES),
        config=dataclasses.replace(fleet.config, max_cpu_loras=max_cpu_loras),
    )
    scheduler = build_scheduler(policy="learned-costs", seed=1)
    assert isinstance(scheduler, ProfileScheduler)
    scheduler.state.residency.params = ResidencyParams(default_max_cpu_lora=max_cpu_loras)
    (scorer,) = [w.scorer for w in scheduler.profile.scorers if isinstance(w.scorer, PredictedTtftScorer)]
    requests = workload.generate(sc.workload, sc.seed)
    assert 500 <= len(requests) <= 700
    simulate("learned-costs", fleet, requests, seed=sc.seed, scheduler=scheduler)
    return scorer.estimator, fleet


def test_learns_the_pod_models_load_costs() -> None:
    # Host memory holds every adapter: a miss is a storage read the first time a pod loads an
    # adapter, a host copy after that.
    estimator, fleet = _learn(max_cpu_loras=128)
    pool = estimator.pool
    assert pool.storage_loads >= 50 and pool.host_loads >= 20
    assert pool.storage_load_s == pytest.approx(fleet.profile.load_s(AdapterTier.DISK), rel=0.2)
    assert pool.host_load_s == pytest.approx(fleet.profile.load_s(AdapterTier.CPU), rel=0.2)
    # Each pod on its own (about 10 to 40 storage reads each) as well.
    for name in (f"vllm-{i}-rank-0" for i in range(4)):
        assert estimator.pod(name).storage_load_s == pytest.approx(
            fleet.profile.load_s(AdapterTier.DISK), rel=0.2
        )
