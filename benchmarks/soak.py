"""Load and soak through real Envoy + `epp serve` + `epp sim` pods, beside Envoy direct to the sims.

Run:  .venv/bin/python benchmarks/soak.py [--rate 50] [--duration-s 30] [--pods 4] [--hot-requests 2000]
      [--single-requests 300] [--json results.json]

Two stacks on loopback start side by side: one routes through the EPP (full scheduling, the
default policy), the other is the same Envoy with a plain round-robin cluster of its own sims
("direct"). The sims answer at once (no simulated token time), so the difference is what the
EPP adds. Three phases, each bounded in count and time:

1. soak: open loop at `--rate` requests/s on each stack for `--duration-s`; P50/P99 latency of
   both and the added latency, errors, the EPP's CPU time (from /proc/<pid>/stat) and its RSS at
   start and end (from /proc/<pid>/status);
2. hot path: closed loop at concurrency 16 for `--hot-requests` on each stack: requests/s;
3. one connection: `--single-requests` sequential requests on each: added P50.

Numbers are wall-clock on whatever machine runs it (the EPP, Envoy, the sims and this client
share its cores).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import os
import pathlib
import sys
import time
from collections.abc import Iterator, Sequence

import aiohttp

from epp.envoy.config import RoutingMode
from epp.localstack import LocalStack, SimOptions, StackOptions

ADAPTERS = tuple(f"adapter-{i}" for i in range(4))
CLOCK_TICKS_PER_S = os.sysconf("SC_CLK_TCK")
HOT_CONCURRENCY = 16
REQUEST_TIMEOUT_S = 30.0


@dataclasses.dataclass(slots=True)
class Samples:
    latencies_s: list[float] = dataclasses.field(default_factory=list)
    errors: int = 0
    statuses: dict[int, int] = dataclasses.field(default_factory=dict)

    def add(self, status: int, latency_s: float) -> None:
        self.statuses[status] = self.statuses.get(status, 0) + 1
        if status == 200:
            self.latencies_s.append(latency_s)
        else:
            self.errors += 1

    def quantile_ms(self, q: float) -> float:
        if not self.latencies_s:
            return float("nan")
        ordered = sorted(self.latencies_s)
        return 1000 * ordered[min(len(ordered) - 1, int(q * len(ordered)))]


@dataclasses.dataclass(frozen=True, slots=True)
class ProcessUsage:
    cpu_s: float
    rss_bytes: int


def process_usage(pid: int) -> ProcessUsage:
    stat = pathlib.Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2 :].split()
    cpu_s = (int(fields[11]) + int(fields[12])) / CLOCK_TICKS_PER_S  # utime + stime
    rss_kib = 0
    for line in pathlib.Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            rss_kib = int(line.split()[1])
    return ProcessUsage(cpu_s, rss_kib * 1024)


def epp_pid(grpc_port: int) -> int:
    """The `epp serve` child listening on `grpc_port` (found by its command line)."""
    me = os.getpid()
    for entry in pathlib.Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        if parent == me and b"serve" in argv and str(grpc_port).encode() in argv:
            return int(entry.name)
    raise RuntimeError("epp serve process not found")


def bodies() -> Iterator[bytes]:
    index = 0
    while True:
        model = ADAPTERS[index % len(ADAPTERS)] if index % 5 else "base"
        yield json.dumps({"model": model, "prompt": f"request {index}: say hello", "max_tokens": 1}).encode()
        index += 1


async def send(session: aiohttp.ClientSession, url: str, body: bytes, samples: Samples) -> None:
    started = time.perf_counter()
    try:
        async with session.post(url, data=body, headers={"content-type": "application/json"}) as response:
            await response.read()
            status = response.status
    except (aiohttp.ClientError, TimeoutError):
        status = 0
    samples.add(status, time.perf_counter() - started)


async def open_loop(urls: Sequence[str], rate: float, duration_s: float) -> list[Samples]:
    """`rate` requests/s to each URL for `duration_s`, whatever the replies' pace (in flight capped)."""
    results = [Samples() for _ in urls]
    timeout = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S)
    connector = aiohttp.TCPConnector(limit=0)
    pending: set[asyncio.Task[None]] = set()
    source = bodies()
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
        start = time.perf_counter()
        count = int(rate * duration_s)
        for index in range(count):
            delay = start + index / rate - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            body = next(source)
            for url, samples in zip(urls, results, strict=True):
                if len(pending) < 2000:
                    task = asyncio.create_task(send(session, url, body, samples))
                    pending.add(task)
                    task.add_done_callback(pending.discard)
                else:
                    samples.add(0, 0.0)
        await asyncio.gather(*pending)
    return results


async def closed_loop(url: str, concurrency: int, requests: int) -> tuple[Samples, float]:
    samples = Samples()
    timeout = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S)
    source = bodies()
    remaining = requests

    async def worker(session: aiohttp.ClientSession) -> None:
        nonlocal remaining
        while remaining > 0:
            remaining -= 1
            await send(session, url, next(source), samples)

    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
        started = time.perf_counter()
        await asyncio.gather(*(worker(session) for _ in range(concurrency)))
        elapsed_s = time.perf_counter() - started
    return samples, elapsed_s


def stack_options(pods: int, routing: RoutingMode) -> StackOptions:
    sim = SimOptions(
        adapters=ADAPTERS,
        max_loras=2,
        max_num_seqs=256,
        time_to_first_token_s=0.0,
        inter_token_latency_s=0.0,
        lora_load_latency_s=0.0,
    )
    return StackOptions(pods=pods, sim=sim, routing=routing, extra_serve_args=("--v", "1"))


async def run(args: argparse.Namespace) -> dict[str, object]:
    with contextlib.ExitStack() as stacks:
        epp = stacks.enter_context(LocalStack(stack_options(args.pods, RoutingMode.EPP), seed=1))
        direct = stacks.enter_context(LocalStack(stack_options(args.pods, RoutingMode.ROUND_ROBIN), seed=2))
        epp_url = f"{epp.gateway_url}/v1/completions"
        direct_url = f"{direct.gateway_url}/v1/completions"
        pid = epp_pid(epp.epp_grpc_port)
        await closed_loop(epp_url, 4, 100)  # warm-up: connections, adapters loaded
        await closed_loop(direct_url, 4, 100)

        before = process_usage(pid)
        soak_started = time.perf_counter()
        soak_epp, soak_direct = await open_loop([epp_url, direct_url], args.rate, args.duration_s)
        soak_elapsed_s = time.perf_counter() - soak_started
        after = process_usage(pid)

        hot_epp, hot_epp_s = await closed_loop(epp_url, HOT_CONCURRENCY, args.hot_requests)
        hot_direct, hot_direct_s = await closed_loop(direct_url, HOT_CONCURRENCY, args.hot_requests)
        single_epp, _ = await closed_loop(epp_url, 1, args.single_requests)
        single_direct, _ = await closed_loop(direct_url, 1, args.single_requests)

    return {
        "soak": {
            "rate_per_stack": args.rate,
            "duration_s": round(soak_elapsed_s, 2),
            "epp_p50_ms": round(soak_epp.quantile_ms(0.5), 3),
            "epp_p99_ms": round(soak_epp.quantile_ms(0.99), 3),
            "direct_p50_ms": round(soak_direct.quantile_ms(0.5), 3),
            "direct_p99_ms": round(soak_direct.quantile_ms(0.99), 3),
            "added_p50_ms": round(soak_epp.quantile_ms(0.5) - soak_direct.quantile_ms(0.5), 3),
            "added_p99_ms": round(soak_epp.quantile_ms(0.99) - soak_direct.quantile_ms(0.99), 3),
            "epp_errors": soak_epp.errors,
            "direct_errors": soak_direct.errors,
            "epp_statuses": soak_epp.statuses,
            "epp_cpu_s": round(after.cpu_s - before.cpu_s, 2),
            "epp_cpu_cores": round((after.cpu_s - before.cpu_s) / soak_elapsed_s, 3),
            "epp_rss_start_mib": round(before.rss_bytes / 2**20, 1),
            "epp_rss_end_mib": round(after.rss_bytes / 2**20, 1),
            "epp_rss_growth_mib": round((after.rss_bytes - before.rss_bytes) / 2**20, 1),
        },
        "hot_path": {
            "concurrency": HOT_CONCURRENCY,
            "requests": args.hot_requests,
            "epp_rps": round(len(hot_epp.latencies_s) / hot_epp_s, 1),
            "direct_rps": round(len(hot_direct.latencies_s) / hot_direct_s, 1),
            "epp_errors": hot_epp.errors,
        },
        "one_connection": {
            "requests": args.single_requests,
            "epp_p50_ms": round(single_epp.quantile_ms(0.5), 3),
            "direct_p50_ms": round(single_direct.quantile_ms(0.5), 3),
            "added_p50_ms": round(single_epp.quantile_ms(0.5) - single_direct.quantile_ms(0.5), 3),
        },
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--rate", type=float, default=50.0, help="requests/s to each stack in the soak")
    parser.add_argument("--duration-s", type=float, default=30.0, help="soak length in seconds")
    parser.add_argument("--pods", type=int, default=4)
    parser.add_argument("--hot-requests", type=int, default=2000)
    parser.add_argument("--single-requests", type=int, default=300)
    parser.add_argument("--json", type=pathlib.Path, default=None, help="also write the results here")
    args = parser.parse_args(argv)
    if not (0 < args.rate <= 2000 and 0 < args.duration_s <= 3600):
        parser.error("--rate must be in (0, 2000] and --duration-s in (0, 3600]")
    results = asyncio.run(run(args))
    text = json.dumps(results, indent=2)
    print(text)
    if args.json is not None:
        args.json.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
