"""Load and soak through real Envoy + `epp serve` + `epp sim` pods, beside Envoy direct to the sims.

Run:  .venv/bin/python benchmarks/soak.py [--rate 50] [--duration-s 30] [--pods 4] [--hot-requests 2000]
      [--single-requests 300] [--pin] [--skip-soak] [--json results.json]

Two stacks on loopback start side by side: one routes through the EPP (full scheduling, the
default policy), the other is the same Envoy with a plain round-robin cluster of its own sims
("direct"). The sims answer at once (no simulated token time), so the difference is what the
EPP adds. Three phases, each bounded in count and time:

1. soak: open loop at `--rate` requests/s on each stack for `--duration-s`; P50/P99 latency of
   both and the added latency, errors, the EPP's CPU time (from /proc/<pid>/stat) and its RSS at
   start and end (from /proc/<pid>/status);
2. hot path: closed loop at concurrency 16 for `--hot-requests` on each stack: requests/s, and
   the CPU seconds the EPP and each Envoy spent on it, so `epp_rps_per_cpu_s` is the rate one
   EPP process would sustain with a core of its own. `epp_idle_cpu_cores` is what the EPP spends
   with no traffic (scraping the pods' /metrics every 50 ms), measured just before; the
   `_net` figure leaves that out;
3. one connection: `--single-requests` sequential requests on each: added P50.

Numbers are wall-clock on whatever machine runs it (the EPP, Envoy, the sims and this client
share its cores). `--pin` gives the EPP process the first allowed CPU and everything else
(both Envoys, the sims, this client) the others, so the EPP is not starved by the load it serves.
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
IDLE_WINDOW_S = 3.0


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


def children() -> dict[int, list[bytes]]:
    """This process's direct children: pid -> argv."""
    me = os.getpid()
    found: dict[int, list[bytes]] = {}
    for entry in pathlib.Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        if parent == me:
            found[int(entry.name)] = argv
    return found


def epp_pid(grpc_port: int) -> int:
    """The `epp serve` child listening on `grpc_port` (found by its command line)."""
    for pid, argv in children().items():
        if b"serve" in argv and str(grpc_port).encode() in argv:
            return pid
    raise RuntimeError("epp serve process not found")


def pin(pid: int, cpus: set[int]) -> None:
    """Every thread of `pid` (grpc and Envoy run several) onto `cpus`; threads made later inherit it."""
    for task in pathlib.Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(ProcessLookupError):
            os.sched_setaffinity(int(task.name), cpus)


def pin_stacks(epp: int) -> dict[str, list[int]]:
    """The EPP on the first allowed CPU, every other child and this client on the rest."""
    allowed = sorted(os.sched_getaffinity(0))
    if len(allowed) < 2:
        raise RuntimeError("--pin needs at least 2 CPUs")
    epp_cpus, rest = {allowed[0]}, set(allowed[1:])
    pin(epp, epp_cpus)
    for pid in children():
        if pid != epp:
            pin(pid, rest)
    pin(os.getpid(), rest)
    return {"epp": sorted(epp_cpus), "others": sorted(rest)}


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


def cpu_s(pid: int | None) -> float:
    return process_usage(pid).cpu_s if pid is not None else float("nan")


async def run(args: argparse.Namespace) -> dict[str, object]:
    results: dict[str, object] = {}
    with contextlib.ExitStack() as stacks:
        epp = stacks.enter_context(LocalStack(stack_options(args.pods, RoutingMode.EPP), seed=1))
        direct = stacks.enter_context(LocalStack(stack_options(args.pods, RoutingMode.ROUND_ROBIN), seed=2))
        epp_url = f"{epp.gateway_url}/v1/completions"
        direct_url = f"{direct.gateway_url}/v1/completions"
        pid = epp_pid(epp.epp_grpc_port)
        epp_envoy = epp.envoy.pid if epp.envoy is not None else None
        direct_envoy = direct.envoy.pid if direct.envoy is not None else None
        if args.pin:
            results["pinned_cpus"] = pin_stacks(pid)
        await closed_loop(epp_url, 4, 100)  # warm-up: connections, adapters loaded
        await closed_loop(direct_url, 4, 100)

        if not args.skip_soak:
            before = process_usage(pid)
            soak_started = time.perf_counter()
            soak_epp, soak_direct = await open_loop([epp_url, direct_url], args.rate, args.duration_s)
            soak_elapsed_s = time.perf_counter() - soak_started
            after = process_usage(pid)
            results["soak"] = soak_report(args.rate, soak_elapsed_s, soak_epp, soak_direct, before, after)

        idle_before = cpu_s(pid)
        await asyncio.sleep(IDLE_WINDOW_S)
        idle_cores = (cpu_s(pid) - idle_before) / IDLE_WINDOW_S

        before_cpu = (cpu_s(pid), cpu_s(epp_envoy))
        hot_epp, hot_epp_s = await closed_loop(epp_url, HOT_CONCURRENCY, args.hot_requests)
        epp_cpu = cpu_s(pid) - before_cpu[0]
        epp_envoy_cpu = cpu_s(epp_envoy) - before_cpu[1]
        direct_envoy_before = cpu_s(direct_envoy)
        hot_direct, hot_direct_s = await closed_loop(direct_url, HOT_CONCURRENCY, args.hot_requests)
        direct_envoy_cpu = cpu_s(direct_envoy) - direct_envoy_before
        served = len(hot_epp.latencies_s)
        epp_net_cpu = max(1e-9, epp_cpu - idle_cores * hot_epp_s)
        results["hot_path"] = {
            "concurrency": HOT_CONCURRENCY,
            "requests": args.hot_requests,
            "epp_rps": round(served / hot_epp_s, 1),
            "direct_rps": round(len(hot_direct.latencies_s) / hot_direct_s, 1),
            "epp_errors": hot_epp.errors,
            "epp_cpu_s": round(epp_cpu, 2),
            "epp_cpu_cores": round(epp_cpu / hot_epp_s, 3),
            "epp_idle_cpu_cores": round(idle_cores, 3),
            "epp_cpu_ms_per_request": round(1000 * epp_cpu / max(1, served), 3),
            "epp_rps_per_cpu_s": round(served / max(1e-9, epp_cpu), 1),
            "epp_rps_per_cpu_s_net": round(served / epp_net_cpu, 1),
            "envoy_with_epp_cpu_ms_per_request": round(1000 * epp_envoy_cpu / max(1, served), 3),
            "envoy_direct_cpu_ms_per_request": round(
                1000 * direct_envoy_cpu / max(1, len(hot_direct.latencies_s)), 3
            ),
        }

        single_epp, _ = await closed_loop(epp_url, 1, args.single_requests)
        single_direct, _ = await closed_loop(direct_url, 1, args.single_requests)
        results["one_connection"] = {
            "requests": args.single_requests,
            "epp_p50_ms": round(single_epp.quantile_ms(0.5), 3),
            "direct_p50_ms": round(single_direct.quantile_ms(0.5), 3),
            "added_p50_ms": round(single_epp.quantile_ms(0.5) - single_direct.quantile_ms(0.5), 3),
        }
    return results


def soak_report(
    rate: float,
    elapsed_s: float,
    epp: Samples,
    direct: Samples,
    before: ProcessUsage,
    after: ProcessUsage,
) -> dict[str, object]:
    return {
        "rate_per_stack": rate,
        "duration_s": round(elapsed_s, 2),
        "epp_p50_ms": round(epp.quantile_ms(0.5), 3),
        "epp_p99_ms": round(epp.quantile_ms(0.99), 3),
        "direct_p50_ms": round(direct.quantile_ms(0.5), 3),
        "direct_p99_ms": round(direct.quantile_ms(0.99), 3),
        "added_p50_ms": round(epp.quantile_ms(0.5) - direct.quantile_ms(0.5), 3),
        "added_p99_ms": round(epp.quantile_ms(0.99) - direct.quantile_ms(0.99), 3),
        "epp_errors": epp.errors,
        "direct_errors": direct.errors,
        "epp_statuses": epp.statuses,
        "epp_cpu_s": round(after.cpu_s - before.cpu_s, 2),
        "epp_cpu_cores": round((after.cpu_s - before.cpu_s) / elapsed_s, 3),
        "epp_rss_start_mib": round(before.rss_bytes / 2**20, 1),
        "epp_rss_end_mib": round(after.rss_bytes / 2**20, 1),
        "epp_rss_growth_mib": round((after.rss_bytes - before.rss_bytes) / 2**20, 1),
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--rate", type=float, default=50.0, help="requests/s to each stack in the soak")
    parser.add_argument("--duration-s", type=float, default=30.0, help="soak length in seconds")
    parser.add_argument("--pods", type=int, default=4)
    parser.add_argument("--hot-requests", type=int, default=2000)
    parser.add_argument("--single-requests", type=int, default=300)
    parser.add_argument("--pin", action="store_true", help="the EPP on one CPU, everything else on the rest")
    parser.add_argument(
        "--skip-soak", action="store_true", help="only the hot-path and one-connection phases"
    )
    parser.add_argument("--json", type=pathlib.Path, default=None, help="also write the results here")
    args = parser.parse_args(argv)
    if not (0 < args.rate <= 2000 and 0 < args.duration_s <= 3600):
        parser.error("--rate must be in (0, 2000] and --duration-s in (0, 3600]")
    if not (0 < args.hot_requests <= 1_000_000 and 0 < args.single_requests <= 1_000_000):
        parser.error("--hot-requests and --single-requests must be in (0, 1000000]")
    results = asyncio.run(run(args))
    text = json.dumps(results, indent=2)
    print(text)
    if args.json is not None:
        args.json.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
