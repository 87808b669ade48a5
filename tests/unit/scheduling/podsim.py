"""A tiny pure step simulation of vLLM pods with LoRA slots, for scenario tests.

Each pod has `max_lora` GPU slots in LRU order and runs up to `max_num_seqs` requests;
a queued request whose adapter is not in a slot loads it (a "swap") into a free slot or
in place of the least-recently-used slot with nothing running, else it waits (vLLM's
"deferred"). Scrapes report what real vLLM reports: queue, running, deferred, KV usage,
and only the adapters with running requests. Time is plain floats.
"""

from __future__ import annotations

import random
from collections import Counter, OrderedDict, deque
from dataclasses import dataclass, field

from epp.errors import EppError
from epp.picker.datastore.types import Endpoint, EndpointState, Metrics, Snapshot
from epp.picker.scheduling.types import LLMRequest, Scheduler

BASE = "base-model"


@dataclass
class SimPod:
    name: str
    ip: str
    max_lora: int
    max_num_seqs: int
    slots: OrderedDict[str, None] = field(default_factory=OrderedDict)
    queue: deque[tuple[LLMRequest, float]] = field(default_factory=deque)
    running: list[tuple[LLMRequest, float]] = field(default_factory=list)  # (request, end time)
    loads: Counter[str] = field(default_factory=Counter)
    metrics: Metrics | None = None

    def endpoint(self) -> Endpoint:
        return Endpoint(name=f"{self.name}-rank-0", pod_name=self.name, namespace="ns", ip=self.ip, port=8000)

    def _place(self, adapter: str) -> bool:
        if adapter == BASE:
            return True
        if adapter in self.slots:
            self.slots.move_to_end(adapter)
            return True
        if len(self.slots) >= self.max_lora:
            busy = {r.target_model for r, _ in self.running}
            victim = next((a for a in self.slots if a not in busy), None)
            if victim is None:
                return False
            del self.slots[victim]
        self.slots[adapter] = None
        self.loads[adapter] += 1
        return True

    def step(self, now: float, service_s: float) -> list[LLMRequest]:
        done = [r for r, end in self.running if end <= now]
        self.running = [(r, end) for r, end in self.running if end > now]
        still_waiting: deque[tuple[LLMRequest, float]] = deque()
        while self.queue:
            request, arrived = self.queue.popleft()
            if len(self.running) < self.max_num_seqs and self._place(request.target_model):
                self.running.append((request, now + service_s))
            else:
                still_waiting.append((request, arrived))
        self.queue = still_waiting
        return done

    def scrape(self, now: float) -> None:
        running_adapters = frozenset(r.target_model for r, _ in self.running if r.target_model != BASE)
        deferred = sum(
            1
            for r, _ in self.queue
            if r.target_model != BASE
            and r.target_model not in self.slots
            and len(self.running) < self.max_num_seqs
        )
        self.metrics = Metrics(
            updated_at=now,
            waiting_requests=len(self.queue),
            running_requests=len(self.running),
            deferred_requests=deferred,
            kv_cache_usage=min(1.0, len(self.running) / self.max_num_seqs * 0.6 + len(self.queue) * 0.01),
            lora_enabled=True,
            max_lora=self.max_lora,
            running_adapters=running_adapters,
            waiting_adapters=running_adapters,
            served_model_name=BASE,
        )


@dataclass
class SimResult:
    loads: Counter[str]
    served: int
    completed: int
    dropped: int
    homes_over_time: dict[str, set[str]]
    max_queue: int
    requests_by_adapter: Counter[str]


def zipf_adapters(n: int, alpha: float) -> tuple[list[str], list[float]]:
    names = [f"lora-{i}" for i in range(n)]
    weights = [1.0 / (i + 1) ** alpha for i in range(n)]
    return names, weights


def run_sim(
    scheduler: Scheduler,
    *,
    pods: int,
    max_lora: int,
    adapters: list[str],
    weights: list[float],
    rate_per_s: float,
    duration_s: float,
    seed: int,
    max_num_seqs: int = 8,
    service_s: float = 1.0,
    scrape_interval_s: float = 0.2,
    step_s: float = 0.05,
) -> SimResult:
    rng = random.Random(seed)
    sim_pods = [SimPod(f"pod-{i}", f"127.0.0.{i + 1}", max_lora, max_num_seqs) for i in range(pods)]
    by_name = {p.endpoint().name: p for p in sim_pods}
    now = 0.0
    next_scrape = 0.0
    served = completed = dropped = 0
    homes: dict[str, set[str]] = {}
    max_queue = 0
    requested: Counter[str] = Counter()
    request_no = 0
    steps = int(duration_s / step_s)
    for step in range(steps + int(30 / step_s)):  # then drain for up to 30 s
        now = step * step_s
        if now >= next_scrape:
            for p in sim_pods:
                p.scrape(now)
            next_scrape = now + scrape_interval_s
        states = tuple(EndpointState(p.endpoint(), p.metrics) for p in sim_pods)
        snapshot = Snapshot(None, states, {}, {}, now, step)
        arrivals = _poisson(rng, rate_per_s * step_s) if step < steps else 0
        for _ in range(arrivals):
            adapter = rng.choices(adapters, weights)[0]
            request = LLMRequest(
                request_id=f"r{request_no}",
                incoming_model=adapter,
                target_model=adapter,
                prompt=f"system prompt for {adapter} " * 8 + str(request_no),
                arrival_s=now,
            )
            request_no += 1
            requested[adapter] += 1
            try:
                result = scheduler.schedule(request, states, snapshot, now)
            except EppError:
                dropped += 1
                continue
            scheduler.on_routed(request, result, now)
            pod = by_name[result.primary.name]
            pod.queue.append((request, now))
            homes.setdefault(adapter, set()).add(pod.name)
            served += 1
        for p in sim_pods:
            for request in p.step(now, service_s):
                scheduler.on_completed(request, p.endpoint().name, now)
                completed += 1
            max_queue = max(max_queue, len(p.queue))
        if step >= steps and completed == served:
            break
    loads: Counter[str] = Counter()
    for p in sim_pods:
        loads.update(p.loads)
    return SimResult(loads, served, completed, dropped, homes, max_queue, requested)


def _poisson(rng: random.Random, mean: float) -> int:
    # Knuth's method; means here are small (< 5 per step).
    limit = 2.718281828459045 ** (-mean)
    k, p = 0, 1.0
    while True:
        p *= rng.random()
        if p <= limit:
            return k
        k += 1
