"""Active-active EPP replicas on a real request path: EPP CPU per request, errors and adapter loads
with one `epp serve` and with several exchanging their routing (`--peers`), same workload.

Run:  .venv/bin/python -m benchmarks.active_active [--replicas 1,2] [--rate 16] [--requests 480]
      [--pods 4] [--seed 1] [--peers tls|plaintext|both]

`--peers` says how replicas exchange their routing: over mutual TLS (`tls`, the default, as the
chart and manifests run it), in plaintext (`--peer-insecure`), or `both`: every count above one
is measured twice, TLS first, on stacks started one after the other in the same run.

Each count gets its own stack (real Envoy whose EPP cluster has every replica, `epp sim` pods as
`benchmarks/soak.py` configures them, the EPPs scraping every second), one after the other. The
workload is soak's: output lengths from the Azure conversation trace, half streamed, four adapters
and the base model, open loop at `--rate`. EPP CPU is every replica's utime + stime from
/proc/<pid>/stat over the run, net of the replicas' own background (their CPU over an idle window
of the same length just before, scraping and, with peers, heartbeats). Prints, per count: requests,
errors, EPP CPU ms per request (all replicas together), requests per EPP CPU-second, the pods' adapter
loads, and the ratio of each to the first row's.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import sys
import time
from collections.abc import Sequence

from benchmarks.soak import cpu_s, open_loop, stack_options, trace_requests
from epp.tools.envoy.bootstrap import RoutingMode
from epp.tools.localstack import LocalStack


@dataclasses.dataclass(frozen=True, slots=True)
class Figures:
    replicas: int
    peers: str  # "tls", "plaintext", or "-" for one replica
    requests: int
    errors: int
    cpu_ms_per_request: float
    adapter_loads: float

    @property
    def requests_per_cpu_s(self) -> float:
        return 1000.0 / self.cpu_ms_per_request if self.cpu_ms_per_request > 0 else float("inf")


def epp_cpu_s(stack: LocalStack, replicas: int) -> float:
    pids = [slot.process.process.pid for slot in stack.epp_slots[:replicas] if slot.process is not None]
    return sum(cpu_s(pid) for pid in pids)


async def measure(replicas: int, peer_tls: bool, args: argparse.Namespace) -> Figures:
    options = dataclasses.replace(
        stack_options(args.pods, RoutingMode.EPP, process_responses=False),
        epp_replicas=replicas,
        peer_tls=peer_tls,
    )
    with LocalStack(options, seed=args.seed) as stack:
        window_s = args.requests / args.rate
        idle_start = epp_cpu_s(stack, replicas)
        await asyncio.sleep(window_s)
        background_per_s = (epp_cpu_s(stack, replicas) - idle_start) / window_s
        loads_before = sum(stack.adapter_loads().values())
        started, cpu_before = time.perf_counter(), epp_cpu_s(stack, replicas)
        [samples] = await open_loop(
            [[stack.gateway_url]], args.rate, args.requests, trace_requests(args.seed)
        )
        elapsed_s = time.perf_counter() - started
        net_cpu_s = epp_cpu_s(stack, replicas) - cpu_before - background_per_s * elapsed_s
        loads = sum(stack.adapter_loads().values()) - loads_before
    peers = "-" if replicas == 1 else ("tls" if peer_tls else "plaintext")
    return Figures(replicas, peers, args.requests, samples.errors, 1000.0 * net_cpu_s / args.requests, loads)


def runs(replicas: Sequence[int], peers: str) -> list[tuple[int, bool]]:
    """(replica count, peer TLS) per stack, in the order they run."""
    modes = {"tls": [True], "plaintext": [False], "both": [True, False]}[peers]
    return [(count, tls) for count in replicas for tls in (modes if count > 1 else [True])]


async def run(args: argparse.Namespace) -> list[Figures]:
    return [await measure(count, tls, args) for count, tls in runs(args.replicas, args.peers)]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--replicas", type=lambda t: [int(x) for x in t.split(",")], default=[1, 2])
    parser.add_argument("--rate", type=float, default=16.0)
    parser.add_argument("--requests", type=int, default=480)
    parser.add_argument("--pods", type=int, default=4)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--peers", choices=("tls", "plaintext", "both"), default="tls")
    parser.add_argument("--json", default=None, help="also write the figures here")
    args = parser.parse_args(argv)
    figures = asyncio.run(run(args))
    first = figures[0]
    print(f"{'replicas':>8} {'peers':>9} {'requests':>8} {'errors':>6} {'EPP CPU ms/req':>14} "
          f"{'req/CPU-s':>9} {'vs first':>8} {'adapter loads':>13}")  # fmt: skip
    for f in figures:
        print(
            f"{f.replicas:>8} {f.peers:>9} {f.requests:>8} {f.errors:>6} {f.cpu_ms_per_request:>14.3f} "
            f"{f.requests_per_cpu_s:>9.0f} {f.cpu_ms_per_request / first.cpu_ms_per_request:>7.2f}x "
            f"{f.adapter_loads:>13.0f}"
        )
    if args.json:
        with open(args.json, "w", encoding="utf-8") as out:
            json.dump([dataclasses.asdict(f) for f in figures], out, indent=2)
    return 0 if all(f.errors == 0 for f in figures) else 1


if __name__ == "__main__":
    sys.exit(main())
