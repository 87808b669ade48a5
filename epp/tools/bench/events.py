"""The discrete-event loop: arrivals, engine steps and scrapes in simulated time.

One run = one policy on one fleet. The scheduler under test only ever sees what the EPP
would see: a `Snapshot` whose `Metrics` were produced at each pod's last scrape tick
(`scrape_interval_s` apart, each pod at its own phase), so its view is up to one interval
stale, exactly like `epp serve` behind a real scrape loop. Requests go through admission,
`schedule`, `on_routed`; `on_completed` fires when the simulated request ends.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from dataclasses import dataclass

from epp.errors import EppError, ErrorCode
from epp.picker.admission import Admission
from epp.picker.datastore.types import Endpoint, EndpointState, Pool, Snapshot
from epp.picker.scheduling.types import LLMRequest, Scheduler
from epp.tools.bench.model import PodConfig, PodCounters, PodProfile, SimPod, SimRequest
from epp.tools.bench.policies import make_admission, make_scheduler
from epp.tools.bench.workload import prompt_text

_STEP_END = 0
_SCRAPE = 1
POD_PORT = 8000
Progress = Callable[[float], None]  # fraction of simulated time done, 0..1


@dataclass(frozen=True, slots=True)
class Fleet:
    profile: PodProfile
    config: PodConfig
    replicas: int
    scrape_interval_s: float = 0.1


@dataclass(frozen=True, slots=True)
class RunResult:
    policy: str
    replicas: int
    requests: tuple[SimRequest, ...]  # every request, finished or not
    pods: dict[str, PodCounters]
    end_s: float  # simulated time at which the run stopped
    arrivals_end_s: float
    steps: int
    scrapes: int


def pod_endpoint(index: int) -> Endpoint:
    """Pod `index` as the EPP would see it: its own pod IP, one port shared by all pods."""
    pod = f"vllm-{index}"
    return Endpoint(
        name=f"{pod}-rank-0",
        pod_name=pod,
        namespace="bench",
        ip=f"10.0.{index // 250}.{index % 250 + 1}",
        port=POD_PORT,
    )


def simulate(
    policy: str,
    fleet: Fleet,
    requests: list[SimRequest],
    *,
    seed: int,
    drain_limit_s: float = 600.0,
    progress: Progress | None = None,
    scheduler: Scheduler | None = None,
    admission: Admission | None = None,
) -> RunResult:
    """Run `requests` (sorted by arrival; mutated in place) through `policy` on `fleet`.

    Stops when every admitted request has finished or `drain_limit_s` after the last arrival;
    requests still in flight then keep `finish_s = None`.
    """
    sched = scheduler if scheduler is not None else make_scheduler(policy, seed)
    admit = admission if admission is not None else make_admission()
    pods = [SimPod(pod_endpoint(i).name, fleet.profile, fleet.config) for i in range(fleet.replicas)]
    endpoints = [pod_endpoint(i) for i in range(fleet.replicas)]
    index_by_name = {p.name: i for i, p in enumerate(pods)}
    pool = Pool(name="bench", namespace="bench", selector={"app": "vllm"}, target_ports=(POD_PORT,))
    states = [EndpointState(endpoint=e, metrics=None) for e in endpoints]
    version = 0

    def snapshot(now: float) -> Snapshot:
        return Snapshot(
            pool=pool, endpoints=tuple(states), models={}, objectives={}, taken_at=now, version=version
        )

    events: list[tuple[float, int, int, int]] = []  # (time, order, kind, pod index)
    order = 0
    # Each pod is scraped at its own phase, as independent refresh loops drift apart.
    for i in range(fleet.replicas):
        phase = fleet.scrape_interval_s * (i + 0.5) / fleet.replicas
        heapq.heappush(events, (phase, order, _SCRAPE, i))
        order += 1
    arrivals_end = requests[-1].arrival_s if requests else 0.0
    stop_at = arrivals_end + drain_limit_s
    in_flight: dict[int, LLMRequest] = {}
    next_arrival = 0
    now = 0.0
    steps = scrapes = 0
    current = snapshot(0.0)
    report_every = max(1, len(requests) // 200)

    def start_step(i: int, at: float) -> None:
        nonlocal order
        duration = pods[i].begin_step(at)
        if duration is not None:
            heapq.heappush(events, (at + duration, order, _STEP_END, i))
            order += 1

    while True:
        arrival_t = requests[next_arrival].arrival_s if next_arrival < len(requests) else None
        event_t = events[0][0] if events else None
        if arrival_t is not None and (event_t is None or arrival_t < event_t):
            now = arrival_t
            request = requests[next_arrival]
            next_arrival += 1
            llm = LLMRequest(
                request_id=f"r{request.index}",
                incoming_model=request.adapter or fleet.config.served_model_name,
                target_model=request.adapter or fleet.config.served_model_name,
                prompt=prompt_text(request),
                arrival_s=now,
            )
            try:
                admit.admit(llm, current.endpoints, current, now)
                result = sched.schedule(llm, current.endpoints, current, now)
            except EppError as exc:
                if exc.code is not ErrorCode.RESOURCE_EXHAUSTED:
                    raise
                request.rejected = True
                continue
            sched.on_routed(llm, result, now)
            pod_index = index_by_name[result.primary.name]
            pods[pod_index].enqueue(request)
            in_flight[request.index] = llm
            if not pods[pod_index].busy:
                start_step(pod_index, now)
            if progress is not None and next_arrival % report_every == 0:
                progress(min(1.0, now / max(arrivals_end, 1e-9)))
            continue
        if event_t is None:
            break
        if next_arrival >= len(requests) and not in_flight:
            break
        if event_t > stop_at:
            break
        now, _, kind, i = heapq.heappop(events)
        if kind == _STEP_END:
            steps += 1
            for done in pods[i].end_step(now):
                sched.on_completed(in_flight.pop(done.index), done.pod, now)
            start_step(i, now)
        else:
            scrapes += 1
            states[i] = EndpointState(endpoint=endpoints[i], metrics=pods[i].metrics(now))
            version += 1
            current = snapshot(now)
            heapq.heappush(events, (now + fleet.scrape_interval_s, order, _SCRAPE, i))
            order += 1
    if progress is not None:
        progress(1.0)
    return RunResult(
        policy=policy,
        replicas=fleet.replicas,
        requests=tuple(requests),
        pods={p.name: p.counters() for p in pods},
        end_s=now,
        arrivals_end_s=arrivals_end,
        steps=steps,
        scrapes=scrapes,
    )
