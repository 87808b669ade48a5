"""Decision time of a scheduling policy across pool sizes and adapter counts, and its memory.

Run:  .venv/bin/python benchmarks/decision_time.py [--policy default] [--decisions 2000] [--warmup 5000]
      [--endpoints 10,100,1000] [--adapters 10,100,1000] [--memory=false]

For endpoints {10, 100, 1000} × adapters {10, 100, 1000}: warm the scheduler's state
(residency, prefix index, in-flight) with routed requests, then time the decision alone
(with flow control, as the `default` policy runs it: the capacity gate's `placeable`, then
`schedule`) and the decision + recording the pick + finishing an older request in the routing
ledger. Prints median and p99 wall time and the
median CPU time of `schedule` (thread time: less distorted on a busy machine), in µs.
Then reports the memory the scheduler's state holds at 1000 endpoints × 1000 adapters
after warm-up (tracemalloc). Times are wall-clock on whatever machine runs it.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
import tracemalloc

from epp.clock import FakeClock
from epp.picker.assembly import PickerSpec, assemble
from epp.picker.datastore.store import Datastore
from epp.picker.datastore.types import Endpoint, EndpointState, Metrics, Snapshot
from epp.picker.flowcontrol.capacity import Gate
from epp.picker.scheduling.build import POLICY_NAMES
from epp.picker.scheduling.framework import record_routed
from epp.picker.scheduling.types import LLMRequest, Scheduler

BASE = "base-model"


def make_pool(n_endpoints: int, n_adapters: int, rng: random.Random, now: float) -> tuple[EndpointState, ...]:
    states = []
    for i in range(n_endpoints):
        active = frozenset(f"lora-{rng.randrange(n_adapters)}" for _ in range(rng.randrange(3)))
        metrics = Metrics(
            updated_at=now - rng.random() * 0.1,
            waiting_requests=rng.randrange(6),
            running_requests=rng.randrange(9),
            kv_cache_usage=rng.random() * 0.8,
            lora_enabled=True,
            max_lora=4,
            running_adapters=active,
            waiting_adapters=active,
            num_gpu_blocks=8192,
            block_size=16,
            served_model_name=BASE,
        )
        endpoint = Endpoint(
            name=f"pod-{i}-rank-0",
            pod_name=f"pod-{i}",
            namespace="ns",
            ip=f"10.0.{i // 250}.{i % 250 + 1}",
            port=8000,
        )
        states.append(EndpointState(endpoint, metrics))
    return tuple(states)


def make_request(i: int, n_adapters: int, rng: random.Random) -> LLMRequest:
    # Zipf-ish popularity; prompts share a per-adapter system prefix (~1 KB) plus a unique tail.
    adapter = f"lora-{min(n_adapters - 1, int(rng.paretovariate(1.0)) - 1)}"
    prompt = f"You are assistant {adapter}. " * 40 + f"question {i} " * 10
    return LLMRequest(request_id=f"r{i}", incoming_model=adapter, target_model=adapter, prompt=prompt)


def picked(policy: str, now: float) -> tuple[Scheduler, Gate | None]:
    """The scheduler `epp serve` runs for `policy` and the capacity gate it puts before it (None:
    no flow control), both from the one assembly `epp serve` builds its picker with."""
    clock = FakeClock(start=now)
    picker = assemble(PickerSpec(policy=policy, seed=1), Datastore(clock), clock=clock)
    return picker.scheduler, picker.flow.gate if picker.flow is not None else None


def drive(
    scheduler: Scheduler,
    gate: Gate | None,
    pool: tuple[EndpointState, ...],
    n: int,
    n_adapters: int,
    rng: random.Random,
    start: int,
    now: float,
) -> tuple[list[float], list[float], list[float]]:
    snapshot = Snapshot(None, pool, {}, {}, now, 1)
    schedule_us: list[float] = []
    full_us: list[float] = []
    cpu_us: list[float] = []
    in_flight: list[tuple[LLMRequest, str]] = []
    for i in range(start, start + n):
        request = make_request(i, n_adapters, rng)
        c0 = time.thread_time()
        t0 = time.perf_counter()
        candidates = pool if gate is None else (gate.placeable(request, pool, now) or pool)
        result = scheduler.schedule(request, candidates, snapshot, now)
        t1 = time.perf_counter()
        cpu_us.append((time.thread_time() - c0) * 1e6)
        record_routed(scheduler, request, result, now)
        in_flight.append((request, result.primary.name))
        if len(in_flight) > 4 * len(pool):  # keep a realistic number in flight
            done, _ = in_flight.pop(0)
            scheduler.state.ledger.finished(done.request_id, now)
        t2 = time.perf_counter()
        schedule_us.append((t1 - t0) * 1e6)
        full_us.append((t2 - t0) * 1e6)
    return schedule_us, full_us, cpu_us


def p99(values: list[float]) -> float:
    return sorted(values)[int(len(values) * 0.99) - 1]


def _sizes(text: str) -> tuple[int, ...]:
    try:
        sizes = tuple(int(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not sizes or min(sizes) < 1:
        raise argparse.ArgumentTypeError(f"sizes must be positive, got {text!r}")
    return sizes


def _flag(text: str) -> bool:
    if text.lower() in ("true", "1", "yes"):
        return True
    if text.lower() in ("false", "0", "no"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--policy", default="default", choices=POLICY_NAMES)
    parser.add_argument("--decisions", type=int, default=2000)
    parser.add_argument("--warmup", type=int, default=5000)
    parser.add_argument(
        "--endpoints", type=_sizes, default=(10, 100, 1000), help="comma-separated pool sizes"
    )
    parser.add_argument(
        "--adapters", type=_sizes, default=(10, 100, 1000), help="comma-separated adapter counts"
    )
    parser.add_argument("--memory", type=_flag, default=True, help="also measure memory at 1000 × 1000")
    args = parser.parse_args()
    now = 1000.0
    print(f"policy={args.policy} decisions={args.decisions} warmup={args.warmup}")
    print(
        f"{'endpoints':>9} {'adapters':>8} {'schedule p50 µs':>16} {'p99 µs':>8}"
        f" {'+routed p50 µs':>15} {'p99 µs':>8} {'schedule CPU p50 µs':>20}"
    )
    for n_endpoints in args.endpoints:
        for n_adapters in args.adapters:
            rng = random.Random(1)
            pool = make_pool(n_endpoints, n_adapters, rng, now)
            scheduler, gate = picked(args.policy, now)
            drive(scheduler, gate, pool, args.warmup, n_adapters, rng, 0, now)
            sched, full, cpu = drive(scheduler, gate, pool, args.decisions, n_adapters, rng, args.warmup, now)
            print(
                f"{n_endpoints:>9} {n_adapters:>8} {statistics.median(sched):>16.1f} {p99(sched):>8.1f}"
                f" {statistics.median(full):>15.1f} {p99(full):>8.1f} {statistics.median(cpu):>20.1f}"
            )
    if not args.memory:
        return 0
    rng = random.Random(2)
    pool = make_pool(1000, 1000, rng, now)
    tracemalloc.start()
    before = tracemalloc.take_snapshot()
    scheduler, gate = picked(args.policy, now)
    drive(scheduler, gate, pool, 20_000, 1000, rng, 0, now)
    after = tracemalloc.take_snapshot()
    tracemalloc.stop()
    held = sum(stat.size_diff for stat in after.compare_to(before, "filename"))
    print(
        "memory held by scheduler state at 1000 endpoints × 1000 adapters"
        f" after 20000 decisions: {held / 2**20:.1f} MiB"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
