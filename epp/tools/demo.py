"""`epp demo`: the EPP against plain round robin, on this machine, in about a minute.

Two runs with the same seeded workload, each on fresh simulated pods (127.x.y.N) behind a real
Envoy: first Envoy asks the EPP for every request, then Envoy balances round robin with no
EPP. Adapter loads come from the pods' own `vllm_sim:lora_adapter_loads_total`; loading an
adapter costs `--lora-load-latency`, so fewer loads show up as lower latency.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import pathlib
import random
import sys
import time

from epp.tools import loadgen
from epp.tools.envoy.bootstrap import RoutingMode
from epp.tools.envoy.process import EnvoyNotFoundError, EnvoyStartError
from epp.tools.localstack import LocalStack, SimOptions, StackError, StackOptions


@dataclasses.dataclass(frozen=True, slots=True)
class RunResult:
    name: str
    requests: int
    errors: int
    adapter_loads: int
    latencies_s: tuple[float, ...]
    wall_s: float

    @property
    def hit_rate(self) -> float:
        """Share of requests whose adapter was already loaded on the pod that served them."""
        served = self.requests - self.errors
        return max(0.0, 1.0 - self.adapter_loads / served) if served else 0.0

    def percentile_s(self, q: float) -> float:
        return loadgen.percentile(self.latencies_s, q)

    def as_json(self) -> dict[str, object]:
        return {
            "name": self.name,
            "requests": self.requests,
            "errors": self.errors,
            "adapter_loads": self.adapter_loads,
            "adapter_hit_rate": round(self.hit_rate, 4),
            "p50_latency_s": round(self.percentile_s(0.50), 4),
            "p99_latency_s": round(self.percentile_s(0.99), 4),
            "wall_s": round(self.wall_s, 2),
        }


def adapter_names(count: int) -> tuple[str, ...]:
    return tuple(f"adapter-{i}" for i in range(count))


def workload(adapters: tuple[str, ...], requests: int, seed: int) -> list[str]:
    """The adapter of each request: Zipf-like popularity (s = 1.1), seeded."""
    rng = random.Random(seed)
    weights = [1.0 / (rank + 1) ** 1.1 for rank in range(len(adapters))]
    return rng.choices(adapters, weights=weights, k=requests)


def configure_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--pods", type=int, default=4, help="simulated pods (default 4)")
    parser.add_argument("--adapters", type=int, default=8, help="LoRA adapters (default 8)")
    parser.add_argument("--max-loras", type=int, default=2, help="adapter slots per pod (default 2)")
    parser.add_argument("--requests", type=int, default=300, help="requests per run (default 300)")
    parser.add_argument("--concurrency", type=int, default=8, help="requests in flight (default 8)")
    parser.add_argument("--max-tokens", type=int, default=16, help="tokens per completion (default 16)")
    parser.add_argument(
        "--lora-load-latency", type=float, default=0.2, help="seconds per adapter load (default 0.2)"
    )
    parser.add_argument("--seed", type=int, default=1, help="workload seed (default 1)")
    parser.add_argument("--out", type=pathlib.Path, help="also write results.json into this directory")


async def _drive(base_url: str, plan: list[str], concurrency: int, max_tokens: int, label: str) -> RunResult:
    requests = [
        loadgen.Request.completion(adapter, max_tokens, prompt=f"Summarise ticket {n}.")
        for n, adapter in enumerate(plan, start=1)
    ]
    every = max(1, len(plan) // 10)

    def show(done: int) -> None:
        if done % every == 0 or done == len(plan):
            print(f"\r  {label}: {done}/{len(plan)} requests", end="", flush=True)

    started = time.perf_counter()
    answers = await loadgen.closed_loop(
        (base_url,), requests, concurrency=concurrency, timeout_s=60, on_done=show
    )
    print(flush=True)
    latencies = tuple(a.e2e_s for a in answers if a.served)
    return RunResult(
        label, len(plan), len(plan) - len(latencies), 0, latencies, time.perf_counter() - started
    )


def _run_once(args: argparse.Namespace, routing: RoutingMode, label: str, plan: list[str]) -> RunResult:
    sim = SimOptions(
        adapters=adapter_names(args.adapters),
        max_loras=args.max_loras,
        lora_load_latency_s=args.lora_load_latency,
    )
    print(
        f"starting {args.pods} pods, {'EPP + ' if routing is RoutingMode.EPP else ''}Envoy ({label}) …",
        flush=True,
    )
    with LocalStack(StackOptions(pods=args.pods, sim=sim, routing=routing), seed=args.seed) as stack:
        result = asyncio.run(_drive(stack.gateway_url, plan, args.concurrency, args.max_tokens, label))
        loads = int(sum(stack.adapter_loads().values()))
    return dataclasses.replace(result, adapter_loads=loads)


def format_table(results: list[RunResult]) -> str:
    header = (
        f"{'routing':<12} {'requests':>8} {'errors':>6} {'adapter loads':>13}"
        f" {'hit rate':>8} {'P50 ms':>8} {'P99 ms':>8}"
    )
    lines = [header, "-" * len(header)]
    for r in results:
        lines.append(
            f"{r.name:<12} {r.requests:>8} {r.errors:>6} {r.adapter_loads:>13} {r.hit_rate:>8.1%}"
            f" {r.percentile_s(0.5) * 1000:>8.0f} {r.percentile_s(0.99) * 1000:>8.0f}"
        )
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    for name in ("pods", "adapters", "max_loras", "requests", "concurrency", "max_tokens"):
        if getattr(args, name) < 1:
            print(f"epp demo: --{name.replace('_', '-')} must be ≥ 1", file=sys.stderr)
            return 2
    if args.pods > 250:
        print("epp demo: --pods must be ≤ 250", file=sys.stderr)
        return 2
    plan = workload(adapter_names(args.adapters), args.requests, args.seed)
    results: list[RunResult] = []
    try:
        results.append(_run_once(args, RoutingMode.EPP, "epp", plan))
        results.append(_run_once(args, RoutingMode.ROUND_ROBIN, "round-robin", plan))
    except EnvoyNotFoundError as err:
        print(f"epp demo: {err}", file=sys.stderr)
        return 1
    except (EnvoyStartError, StackError) as err:
        print(f"epp demo: could not start the local stack: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("\nepp demo: interrupted; every process was stopped", file=sys.stderr)
        return 130
    print()
    print(format_table(results))
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "results.json").write_text(json.dumps([r.as_json() for r in results], indent=2) + "\n")
        print(f"\nwrote {args.out / 'results.json'}")
    return 0
