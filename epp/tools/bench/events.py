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

import dataclasses
import functools
import heapq
import json
from collections.abc import Callable
from dataclasses import dataclass

from epp.clock import FakeClock
from epp.errors import EppError, ErrorCode
from epp.picker import wire
from epp.picker.admission import Admission
from epp.picker.assembly import Assembly, PeerSpec, PickerSpec, assemble
from epp.picker.datastore.store import Datastore
from epp.picker.datastore.types import InferenceModel, InferenceObjective, PodInfo, Pool
from epp.picker.director import Director
from epp.picker.flowcontrol.settings import PUMP_INTERVAL_S
from epp.picker.lifecycle import Ending, RequestLife, Stage
from epp.picker.scheduling.shared import PeerReplicator
from epp.picker.scheduling.types import Scheduler
from epp.tools.bench.model import PodConfig, PodCounters, PodProfile, SimPod, SimRequest
from epp.tools.bench.policies import policy_spec, replicates_routing
from epp.tools.bench.workload import prompt_text

_STEP_END = 0
_SCRAPE = 1
_PEER_BATCH = 2
_QUEUE_TICK = 3  # flow control's timer, as `epp serve`'s (PUMP_INTERVAL_S)
_DELIVER = 4  # a dispatched request reaches its pod after the EPP's path (`Fleet.epp_latency_s`)
# The gateway's own load balancing, with no EPP on the path: they pay no EPP latency.
GATEWAY_POLICIES = frozenset({"round-robin", "random"})
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
    # Replicas tell each other what they route (`PeerReplicator`), one batch per peer every interval.
    epp_peers: bool = True
    peer_interval_s: float = 0.1
    # Flow control as each policy runs it in `epp serve` (on for `default`); False: never queue.
    flow_control: bool = True
    # The pool's InferenceObjectives: the priorities requests select by header.
    objectives: tuple[InferenceObjective, ...] = ()
    # Added between a request's dispatch and its pod for policies an EPP runs (`Scenario.epp_latency_s`).
    epp_latency_s: float = 0.0


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


def request_headers(request: SimRequest) -> dict[str, str]:
    """The headers a client would send: its tenant's fairness ID and its objective, when it has them."""
    headers = {}
    if request.tenant:
        headers[wire.FAIRNESS_ID_HEADER] = request.tenant
    if request.objective:
        headers[wire.OBJECTIVE_HEADER] = request.objective
    return headers


def request_body(request: SimRequest, base_model: str) -> bytes:
    """The completions request a client would send for this workload entry."""
    return json.dumps(
        {
            "model": request.adapter or base_model,
            "prompt": prompt_text(request),
            "max_tokens": request.output_tokens,
        }
    ).encode()


@dataclass(frozen=True, slots=True)
class EppReplica:
    """One EPP replica: its own datastore (its own scrapes) and its own picker (scheduler state)."""

    datastore: Datastore
    picker: Assembly

    @property
    def director(self) -> Director:
        return self.picker.director

    @property
    def peers(self) -> PeerReplicator | None:
        """With peers: what exchanges this replica's flights."""
        return self.picker.peers


def replica_spec(policy: str, fleet: Fleet, *, seed: int, replica: int = 0) -> PickerSpec:
    """What EPP replica `replica` of `fleet` runs for `policy`: the policy as `epp serve` runs it,
    seeded per replica, with the fleet's flow control and, among several replicas, the peer
    exchange (`epp serve --peers`) at the fleet's interval."""
    peers = None
    if fleet.epp_replicas > 1 and fleet.epp_peers and replicates_routing(policy):
        others = tuple(f"epp-{p}" for p in range(fleet.epp_replicas) if p != replica)
        peers = PeerSpec(own_id=f"epp-{replica}", interval_s=fleet.peer_interval_s, addresses=others)
    return dataclasses.replace(
        policy_spec(policy, seed=seed + replica),
        flow_control=fleet.flow_control,
        peers=peers,
        key_prefix=f"epp-{replica}",
    )


def build_replica(
    policy: str,
    fleet: Fleet,
    clock: FakeClock,
    *,
    seed: int,
    replica: int = 0,
    scheduler: Scheduler | None = None,
    admission: Admission | None = None,
) -> EppReplica:
    """EPP replica `replica` of `fleet`, over a datastore of the fleet's pool (see `replica_spec`)."""
    datastore = bench_datastore(fleet, clock)
    spec = replica_spec(policy, fleet, seed=seed, replica=replica)
    picker = assemble(spec, datastore, clock=clock, scheduler=scheduler, admission=admission)
    return EppReplica(datastore, picker)


class _Run:
    """One simulated run's moving parts: the pods, their events and the EPP replicas in front of them."""

    def __init__(
        self, fleet: Fleet, epps: list[EppReplica], clock: FakeClock, *, epp_latency_s: float = 0.0
    ) -> None:
        self.fleet = fleet
        self.epp_latency_s = epp_latency_s
        self._delivering: dict[int, tuple[SimRequest, int]] = {}  # event order -> (request, pod index)
        self.epps = epps
        self.clock = clock
        # Pods are named after the endpoints the datastore made of them, as scrapes are keyed.
        names = [endpoint.name for endpoint in epps[0].datastore.endpoints()]
        self.pods = [SimPod(name, fleet.profile, fleet.config) for name in names]
        self.index_by_name = {pod.name: i for i, pod in enumerate(self.pods)}
        self.events: list[tuple[float, int, int, int, int]] = []  # (time, order, kind, pod, EPP replica)
        self.order = 0
        self.in_flight: dict[int, RequestLife] = {}
        self.arrivals = 0
        self._ending = -1  # the pod whose step end is being handled
        self.steps = 0
        self.scrapes = 0
        # Each EPP scrapes each pod at its own phase, as independent refresh loops drift apart.
        pods, replicas = fleet.replicas, len(epps)
        for r in range(replicas):
            for i in range(pods):
                self._push(
                    fleet.scrape_interval_s * ((i + 0.5) / pods + r / (replicas * pods)), _SCRAPE, i, r
                )
            if epps[r].peers is not None:
                self._push(fleet.peer_interval_s * (r + 1) / replicas, _PEER_BATCH, 0, r)
            if epps[r].director.flow is not None:
                self._push(PUMP_INTERVAL_S * (r + 1) / replicas, _QUEUE_TICK, 0, r)

    def _push(self, at: float, kind: int, pod_index: int, replica: int = 0) -> None:
        heapq.heappush(self.events, (at, self.order, kind, pod_index, replica))
        self.order += 1

    def _advance(self, now: float) -> None:
        self.clock.advance(now - self.clock.now())

    def arrive(self, request: SimRequest, now: float) -> None:
        """Route one request through the next EPP replica (round robin, as the gateway spreads streams
        over the EPP Service). It starts on its pod now or once flow control dispatches it; a refused
        request is marked, not served."""
        self._advance(now)
        epp = self.epps[self.arrivals % len(self.epps)]
        self.arrivals += 1
        life = epp.director.mint(f"r{request.index}")
        life.waiter = functools.partial(self._left_queue, request)
        try:
            epp.director.arrive(
                life,
                headers=request_headers(request),
                body=request_body(request, self.fleet.config.served_model_name),
            )
        except EppError as exc:
            self._refused(request, life, exc)
            return
        if life.stage is Stage.DISPATCHED:
            life.waiter = None
            self._start(request, life)

    def _left_queue(self, request: SimRequest, life: RequestLife) -> None:
        if life.error is not None:
            self._refused(request, life, life.error)
        else:
            self._start(request, life)

    def _refused(self, request: SimRequest, life: RequestLife, error: EppError) -> None:
        if error.code not in (ErrorCode.RESOURCE_EXHAUSTED, ErrorCode.SERVICE_UNAVAILABLE):
            raise error
        request.rejected = True
        request.refused_status = error.http_status
        request.refused_s = self.clock.now()
        life.refuse(error)
        life.finish(Ending.REFUSED, self.clock.now())

    def _start(self, request: SimRequest, life: RequestLife) -> None:
        """`life` was dispatched: its pod takes the request now."""
        decision = life.decision
        assert decision is not None
        target = decision.request.target_model
        request.adapter = "" if target == self.fleet.config.served_model_name else target
        request.dispatched_s = self.clock.now()
        pod_index = self.index_by_name[decision.primary.name]
        self.in_flight[request.index] = life
        if self.epp_latency_s > 0:
            self._delivering[self.order] = (request, pod_index)
            self._push(self.clock.now() + self.epp_latency_s, _DELIVER, pod_index)
        else:
            self._deliver(request, pod_index)

    def _deliver(self, request: SimRequest, pod_index: int) -> None:
        pod = self.pods[pod_index]
        pod.enqueue(request)
        if not pod.busy and pod_index != self._ending:
            self.start_step(pod_index, self.clock.now())

    def busy(self) -> bool:
        """Requests still on a pod or waiting in some replica's queue."""
        return bool(self.in_flight) or any(
            epp.director.flow is not None and epp.director.flow.queues for epp in self.epps
        )

    def start_step(self, pod_index: int, at: float) -> None:
        duration = self.pods[pod_index].begin_step(at)
        if duration is not None:
            self._push(at + duration, _STEP_END, pod_index)

    def next_event(self) -> None:
        """Handle the earliest step end or scrape."""
        now, order, kind, i, replica = heapq.heappop(self.events)
        self._advance(now)
        if kind == _DELIVER:
            self._deliver(*self._delivering.pop(order))
        elif kind == _STEP_END:
            self.steps += 1
            self._ending = i  # requests dispatched as these finish wait for its next step, begun below
            for done in self.pods[i].end_step(now):
                life = self.in_flight.pop(done.index)
                life.outcome.status = 200
                # What the gateway's access log reports at the response's end: time to first byte
                # from the request's arrival (here its first token, which the pod model times).
                life.outcome.ttft_s = done.ttft_s
                life.finish(Ending.RESPONSE, now)
            self._ending = -1
            self.start_step(i, now)
        elif kind == _SCRAPE:
            self.scrapes += 1
            epp = self.epps[replica]
            epp.datastore.update_metrics(self.pods[i].name, self.pods[i].metrics(now))
            self._push(now + self.fleet.scrape_interval_s, _SCRAPE, i, replica)
        elif kind == _PEER_BATCH:
            self._send_batches(replica, now)
            self._push(now + self.fleet.peer_interval_s, _PEER_BATCH, 0, replica)
        else:
            self.epps[replica].director.pump()
            self._push(now + PUMP_INTERVAL_S, _QUEUE_TICK, 0, replica)

    def _send_batches(self, replica: int, now: float) -> None:
        """Replica `replica`'s batch to each peer, delivered at once (loopback-fast next to the interval)."""
        sender = self.epps[replica].peers
        assert sender is not None
        for r, peer in enumerate(self.epps):
            if r != replica and peer.peers is not None:
                peer.peers.apply(sender.drain(f"epp-{r}", f"epp-{replica}", now), now)
                sender.sent(f"epp-{r}", f"epp-{r}")
                peer.peers.expire(now)
                peer.director.pump()


def bench_datastore(fleet: Fleet, clock: FakeClock) -> Datastore:
    """A datastore holding the fleet's pool and pods, as a pool source would fill it."""
    datastore = Datastore(clock)
    pool = Pool(name=POOL_NAME, namespace=NAMESPACE, selector=POD_LABELS, target_ports=(POD_PORT,))
    datastore.set_pool(pool)
    datastore.replace_pods(pod_info(i) for i in range(fleet.replicas))
    datastore.replace_models(fleet.models)
    datastore.replace_objectives(fleet.objectives)
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
    epps = [
        build_replica(policy, fleet, clock, seed=seed, replica=r, scheduler=scheduler, admission=admission)
        for r in range(fleet.epp_replicas)
    ]
    latency = 0.0 if policy in GATEWAY_POLICIES else fleet.epp_latency_s
    run = _Run(fleet, epps, clock, epp_latency_s=latency)
    arrivals_end = requests[-1].arrival_s if requests else 0.0
    stop_at = arrivals_end + drain_limit_s
    report_every = max(1, len(requests) // 200)
    for n, request in enumerate(requests, start=1):
        while run.events and run.events[0][0] <= request.arrival_s:
            run.next_event()
        run.arrive(request, request.arrival_s)
        if progress is not None and n % report_every == 0:
            progress(min(1.0, request.arrival_s / max(arrivals_end, 1e-9)))
    while run.busy() and run.events and run.events[0][0] <= stop_at:
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
