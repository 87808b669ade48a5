"""Adapter affinity cuts real LoRA slot swaps against round robin: 4 adapters over 2 pods × 2 slots.

The same bounded, concurrent workload (fixed adapter sequence, fixed lengths) runs once through
Envoy + `epp serve` and once through Envoy's plain round robin, against the same two real
vLLM servers (`--max-loras 2`).

Signal: the (pod, adapter) pairs each run put to work, read from the servers themselves.
`vllm:lora_requests_info` writes one series per adapter combination and stamps it with the
wall-clock time it was last current, so the combinations stamped after a run's start are the
adapter sets each pod ran during that run. A pod that ran k > max_lora adapters had to swap
slots at least k − max_lora times, and every extra pod an adapter lands on costs at least one
more load; round robin puts every adapter on both pods (8 pairs). Unlike latency, the count
does not depend on how busy the machine is. The `reason="deferred"` gauge (requests held for a
slot), sampled during each run, is reported beside it; it is a sampled gauge, so only its
direction is checked.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import pathlib
import random
import threading
import time

from epp.tools.envoy.bootstrap import RoutingMode
from testkit.waiting import poll_until
from tests.realvllm.client import ADAPTERS, BASE_MODEL, RawPage, RealPod, completion, idle, scrape
from tests.realvllm.gateway import Gateway

REQUESTS = 48
CONCURRENCY = 8
MAX_TOKENS = 24
SAMPLE_INTERVAL_S = 0.1
MAX_LORAS = 2


@dataclasses.dataclass(frozen=True, slots=True)
class RunResult:
    mode: str
    adapters_by_pod: dict[str, frozenset[str]]
    deferred_samples: int  # scrapes with a deferred request, summed over pods
    wall_s: float
    failures: int

    @property
    def pod_adapter_pairs(self) -> int:
        return sum(len(a) for a in self.adapters_by_pod.values())

    @property
    def min_slot_swaps(self) -> int:
        return sum(max(0, len(a) - MAX_LORAS) for a in self.adapters_by_pod.values())


def workload() -> list[str]:
    rng = random.Random(20261202)
    return [rng.choice(ADAPTERS) for _ in range(REQUESTS)]


def run_workload(mode: RoutingMode, pods: list[RealPod], workdir: pathlib.Path) -> RunResult:
    assert poll_until(lambda: idle(pods), within_s=60)
    with Gateway(pods, workdir, mode=mode) as gateway:
        deferred = 0
        stop = threading.Event()

        def sample() -> None:
            nonlocal deferred
            while not stop.is_set():
                for pod in pods:
                    try:
                        page = RawPage.parse(scrape(pod))
                    except OSError:  # a slow scrape on a busy machine: skip this sample
                        continue
                    if page.value(
                        "vllm:num_requests_waiting_by_reason", model_name=BASE_MODEL, reason="deferred"
                    ):
                        deferred += 1
                stop.wait(SAMPLE_INTERVAL_S)

        sampler = threading.Thread(target=sample, daemon=True)
        started_unix_s = time.time()
        started = time.monotonic()
        sampler.start()
        try:
            with concurrent.futures.ThreadPoolExecutor(max_workers=CONCURRENCY) as pool:
                replies = list(pool.map(lambda model: completion(gateway.url, model, MAX_TOKENS), workload()))
        finally:
            wall_s = time.monotonic() - started
            stop.set()
            sampler.join(timeout=10)
    assert poll_until(lambda: idle(pods), within_s=30)
    adapters_by_pod = {}
    for pod in pods:
        combos = RawPage.parse(scrape(pod)).lora_combinations_since(started_unix_s)
        adapters_by_pod[pod.name] = frozenset().union(*combos) if combos else frozenset()
    return RunResult(
        mode=mode.value,
        adapters_by_pod=adapters_by_pod,
        deferred_samples=deferred,
        wall_s=wall_s,
        failures=sum(1 for r in replies if r.status != 200),
    )


def test_affinity_needs_fewer_slot_swaps_than_round_robin(
    real_pods: list[RealPod], tmp_path: pathlib.Path
) -> None:
    epp = run_workload(RoutingMode.EPP, real_pods, tmp_path / "epp")
    baseline = run_workload(RoutingMode.ROUND_ROBIN, real_pods, tmp_path / "rr")
    summary = "\n".join(
        f"{r.mode}: pairs {r.pod_adapter_pairs}, min swaps {r.min_slot_swaps}, deferred samples "
        f"{r.deferred_samples}, wall {r.wall_s:.1f} s, by pod {dict(sorted(r.adapters_by_pod.items()))}"
        for r in (epp, baseline)
    )
    print(summary)
    assert epp.failures == 0 and baseline.failures == 0, summary
    # Round robin spreads every adapter over both pods: the worst case.
    assert baseline.pod_adapter_pairs == len(ADAPTERS) * len(real_pods), summary
    assert epp.pod_adapter_pairs < baseline.pod_adapter_pairs, summary
    assert epp.min_slot_swaps <= baseline.min_slot_swaps, summary
    assert epp.deferred_samples <= baseline.deferred_samples, summary
