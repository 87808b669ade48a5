"""The discrete-event loop: arrivals, engine steps and scrapes in simulated time.

One run = one policy on one fleet, routed by the same `Director` that `epp serve` runs
(model resolution, the subset hint, admission, scheduling, completion), minus gRPC: each
arrival becomes an OpenAI request body, the Director answers with endpoints, and the
simulated pod of the first endpoint serves it. The Director reads a real `Datastore` whose
metrics come from each pod's last scrape tick (`scrape_interval_s` apart, each pod at its own
phase), so its view is up to one interval stale, exactly like `epp serve` behind a real scrape
loop.
"""

from __future__ import annotations

import heapq
import json
import random
from collections.abc import Callable
from dataclasses import dataclass

from epp.clock import FakeClock
from epp.errors import EppError, ErrorCode
from epp.picker.admission import Admission
from epp.picker.datastore.store import Datastore
from epp.picker.datastore.types import InferenceModel, PodInfo, Pool
from epp.picker.director import Director, RoutingDecision
from epp.picker.scheduling.framework import ProfileScheduler
from epp.picker.scheduling.shared import SharedScheduler
from epp.picker.scheduling.types import Scheduler
from epp.tools.bench.model import PodConfig, PodCounters, PodProfile, SimPod, SimRequest
from epp.tools.bench.policies import make_admission, make_scheduler
from epp.tools.bench.workload import prompt_text

_STEP_END = 0
_SCRAPE = 1
_PEER_BATCH = 2
POD_PORT = 8000
NAMESPACE = "bench"
POD_LABELS = {"app": "vllm"}
POOL_NAME = "bench"
Progress = Callable[[float], None]  # fraction of simulated time done, 0..1


@dataclass(frozen=True, slots=True)
class Fleet:
    profile: PodProfile
    config: PodConfig
    replicas: int
    scrape_interval_s: float = 0.1
    # The pool's InferenceModels; none means clients name adapters directly, as with no registry.
    models: tuple[InferenceModel, ...] = ()
    epp_replicas: int = 1  # active-active EPPs, each with its own scrapes and scheduler state
    # Replicas tell each other what they route (`SharedScheduler`), one batch per peer every interval.
    epp_peers: bool = True
    peer_interval_s: float = 0.1


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


def pod_info(index: int) -> PodInfo:
    """Pod `index` as the pool source would report it: its own pod IP, ready, the pool's labels."""
    return PodInfo(
        name=f"vllm-{index}",
        namespace=NAMESPACE,
        ip=f"10.0.{index // 250}.{index % 250 + 1}",
        labels=POD_LABELS,
    )


def request_body(request: SimRequest, base_model: str) -> bytes:
    """The completions request a client would send for this workload entry."""
    return json.dumps(
        {
            "model": request.adapter or base_model,
            "prompt": prompt_text(request),
            "max_tokens": request.output_tokens,
        }
    ).encode()


@dataclass(slots=True)
class _Epp:
    """One EPP replica: its own datastore (its own scrapes) and its own scheduler state."""

    datastore: Datastore
    director: Director
    shared: SharedScheduler | None = None  # with peers: the scheduler that exchanges batches


class _Run:
    """One simulated run's moving parts: the pods, their events and the EPP replicas in front of them."""

    def __init__(self, fleet: Fleet, epps: list[_Epp], clock: FakeClock) -> None:
        self.fleet = fleet
        self.epps = epps
        self.clock = clock
        # Pods are named after the endpoints the datastore made of them, as scrapes are keyed.
        names = [endpoint.name for endpoint in epps[0].datastore.endpoints()]
        self.pods = [SimPod(name, fleet.profile, fleet.config) for name in names]
        self.index_by_name = {pod.name: i for i, pod in enumerate(self.pods)}
        self.events: list[tuple[float, int, int, int, int]] = []  # (time, order, kind, pod, EPP replica)
        self.order = 0
        self.in_flight: dict[int, tuple[_Epp, RoutingDecision]] = {}
        self.arrivals = 0
        self.steps = 0
        self.scrapes = 0
        # Each EPP scrapes each pod at its own phase, as independent refresh loops drift apart.
        pods, replicas = fleet.replicas, len(epps)
        for r in range(replicas):
            for i in range(pods):
                self._push(
                    fleet.scrape_interval_s * ((i + 0.5) / pods + r / (replicas * pods)), _SCRAPE, i, r
                )
            if epps[r].shared is not None:
                self._push(fleet.peer_interval_s * (r + 1) / replicas, _PEER_BATCH, 0, r)

    def _push(self, at: float, kind: int, pod_index: int, replica: int = 0) -> None:
        heapq.heappush(self.events, (at, self.order, kind, pod_index, replica))
        self.order += 1

    def _advance(self, now: float) -> None:
        self.clock.advance(now - self.clock.now())

    def arrive(self, request: SimRequest, now: float) -> None:
        """Route one request through the next EPP replica (round robin, as the gateway spreads streams
        over the EPP Service); a shed request is marked, not served."""
        self._advance(now)
        epp = self.epps[self.arrivals % len(self.epps)]
        self.arrivals += 1
        base_model = self.fleet.config.served_model_name
        try:
            decision = epp.director.route(
                request_id=f"r{request.index}",
                headers={},
                body=request_body(request, base_model),
                arrival_s=now,
            )
        except EppError as exc:
            if exc.code is not ErrorCode.RESOURCE_EXHAUSTED:
                raise
            request.rejected = True
            return
        target = decision.request.target_model
        request.adapter = "" if target == base_model else target
        pod_index = self.index_by_name[decision.primary.name]
        pod = self.pods[pod_index]
        pod.enqueue(request)
        self.in_flight[request.index] = (epp, decision)
        if not pod.busy:
            self.start_step(pod_index, now)

    def start_step(self, pod_index: int, at: float) -> None:
        duration = self.pods[pod_index].begin_step(at)
        if duration is not None:
            self._push(at + duration, _STEP_END, pod_index)

    def next_event(self) -> None:
        """Handle the earliest step end or scrape."""
        now, _, kind, i, replica = heapq.heappop(self.events)
        self._advance(now)
        if kind == _STEP_END:
            self.steps += 1
            for done in self.pods[i].end_step(now):
                epp, decision = self.in_flight.pop(done.index)
                epp.director.complete(decision, served_address=None, status=200)
            self.start_step(i, now)
        elif kind == _SCRAPE:
            self.scrapes += 1
            self.epps[replica].datastore.update_metrics(self.pods[i].name, self.pods[i].metrics(now))
            self._push(now + self.fleet.scrape_interval_s, _SCRAPE, i, replica)
        else:
            self._send_batches(replica, now)
            self._push(now + self.fleet.peer_interval_s, _PEER_BATCH, 0, replica)

    def _send_batches(self, replica: int, now: float) -> None:
        """Replica `replica`'s batch to each peer, delivered at once (loopback-fast next to the interval)."""
        sender = self.epps[replica].shared
        assert sender is not None
        for r, peer in enumerate(self.epps):
            if r != replica and peer.shared is not None:
                peer.shared.apply(sender.drain(f"epp-{r}", f"epp-{replica}", now), now)
                sender.sent(f"epp-{r}", f"epp-{r}")
                peer.shared.expire(now)


def bench_datastore(fleet: Fleet, clock: FakeClock) -> Datastore:
    """A datastore holding the fleet's pool and pods, as a pool source would fill it."""
    datastore = Datastore(clock)
    pool = Pool(name=POOL_NAME, namespace=NAMESPACE, selector=POD_LABELS, target_ports=(POD_PORT,))
    datastore.set_pool(pool)
    datastore.replace_pods(pod_info(i) for i in range(fleet.replicas))
    datastore.replace_models(fleet.models)
    return datastore


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
    if scheduler is not None and fleet.epp_replicas > 1:
        raise ValueError("a given scheduler is one EPP's; run several replicas by policy name")
    clock = FakeClock(start=0.0)
    epps = []
    for r in range(fleet.epp_replicas):
        datastore = bench_datastore(fleet, clock)
        chosen = scheduler if scheduler is not None else make_scheduler(policy, seed + r)
        shared = None
        if fleet.epp_replicas > 1 and fleet.epp_peers and isinstance(chosen, ProfileScheduler):
            chosen = shared = SharedScheduler(chosen)
            shared.set_peers([f"epp-{p}" for p in range(fleet.epp_replicas) if p != r])
        director = Director(
            datastore,
            chosen,
            admit=(admission if admission is not None else make_admission()).admit,
            clock=clock,
            rng=random.Random(seed + r),
        )
        epps.append(_Epp(datastore, director, shared))
    run = _Run(fleet, epps, clock)
    arrivals_end = requests[-1].arrival_s if requests else 0.0
    stop_at = arrivals_end + drain_limit_s
    report_every = max(1, len(requests) // 200)
    for n, request in enumerate(requests, start=1):
        while run.events and run.events[0][0] <= request.arrival_s:
            run.next_event()
        run.arrive(request, request.arrival_s)
        if progress is not None and n % report_every == 0:
            progress(min(1.0, request.arrival_s / max(arrivals_end, 1e-9)))
    while run.in_flight and run.events and run.events[0][0] <= stop_at:
        run.next_event()
    if progress is not None:
        progress(1.0)
    return RunResult(
        policy=policy,
        replicas=fleet.replicas,
        requests=tuple(requests),
        pods={pod.name: pod.counters() for pod in run.pods},
        end_s=clock.now(),
        arrivals_end_s=arrivals_end,
        steps=run.steps,
        scrapes=run.scrapes,
    )
