"""What the EPP costs on a real request path: CPU per request and per streamed token, added latency,
throughput per core, memory under soak. Real Envoy + `epp serve` + `epp sim` pods on loopback.

Run:  .venv/bin/python benchmarks/soak.py [--rate 8] [--duration-s 20] [--pods 4] [--length-requests 256]
      [--hot-requests 2000] [--single-requests 300] [--seed 1] [--pin] [--skip-soak] [--json results.json]

Three stacks start side by side, each with its own sims (first token at once, 1 ms per further
token, so a streamed response reaches Envoy about one chunk per token, as vLLM's do):

- `epp`: Envoy as `epp envoy-config` writes it by default: the EPP sees the request only and
  learns how it ended from Envoy's gRPC access log;
- `epp+responses`: the same with `--process-responses`: every response chunk passes through
  the EPP (the former default, and what kgateway, Istio and Envoy AI Gateway configure);
- `direct`: the same Envoy with a plain round-robin cluster of its sims, no ext_proc.

Phases, each bounded in count and time, the EPP stacks measured one after the other so each
CPU figure is that EPP's alone:

1. by length: `--length-requests` requests of 8 tokens (not streamed), 8, 256 and 1024 tokens
   (streamed) at concurrency 32 through the `epp` stack (an eighth as many through
   `epp+responses`, whose EPP works ~100× more per long request): EPP CPU per request net of its
   idle scraping, the ext_proc messages Envoy sent per request (its own counter), and the ratio
   to the 8-token non-streamed request;
2. soak: open loop at `--rate` requests/s to every stack for `--duration-s`, half streamed, with
   output lengths drawn from the Azure LLM inference trace (conversation) shipped in
   `epp/bench/data/`: P50/P99 latency and what the EPP adds to them, errors, EPP CPU per request
   and per output token, requests per EPP CPU-second, RSS at start and end;
3. hot path: `--hot-requests` short non-streamed requests at concurrency 16 through each EPP
   stack and direct: requests/s and requests per EPP CPU-second (gross and net of idle), Envoy's
   CPU per request;
4. one connection: `--single-requests` sequential short requests on each stack: added P50.

Wall-clock figures depend on the machine (the EPPs, three Envoys, twelve sims and this client
share its cores); CPU per request much less. `--pin` puts both EPPs on the first allowed CPU and
everything else on the rest.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import os
import pathlib
import random
import sys
import time
from collections.abc import Iterator, Sequence

import aiohttp

from epp.bench.workload import read_trace, resolve_trace
from epp.envoy.config import RoutingMode
from epp.localstack import LocalStack, SimOptions, StackOptions

ADAPTERS = tuple(f"adapter-{i}" for i in range(4))
CLOCK_TICKS_PER_S = os.sysconf("SC_CLK_TCK")
HOT_CONCURRENCY = 16
LENGTH_CONCURRENCY = 32
REQUEST_TIMEOUT_S = 60.0
IDLE_WINDOW_S = 5.0
MAX_TRACE_TOKENS = 2048  # longer outputs are capped (0.1 % of the trace)
LENGTHS = ((8, False), (8, True), (256, True), (1024, True))
EPP_STACKS = ("epp", "epp+responses")
BASELINE_STACK = "baseline+responses"  # --baseline-tree: another checkout's EPP, responses through it


@dataclasses.dataclass(frozen=True, slots=True)
class Request:
    model: str
    max_tokens: int
    stream: bool

    def body(self, index: int) -> bytes:
        payload: dict[str, object] = {
            "model": self.model,
            "prompt": f"request {index}: say hello",
            "max_tokens": self.max_tokens,
        }
        if self.stream:
            payload |= {"stream": True, "stream_options": {"include_usage": True}}
        return json.dumps(payload).encode()


@dataclasses.dataclass(slots=True)
class Samples:
    latencies_s: list[float] = dataclasses.field(default_factory=list)
    errors: int = 0
    tokens: int = 0
    statuses: dict[int, int] = dataclasses.field(default_factory=dict)

    def add(self, status: int, latency_s: float, tokens: int) -> None:
        self.statuses[status] = self.statuses.get(status, 0) + 1
        if status == 200:
            self.latencies_s.append(latency_s)
            self.tokens += tokens
        else:
            self.errors += 1

    @property
    def served(self) -> int:
        return len(self.latencies_s)

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


def cpu_s(pid: int | None) -> float:
    return process_usage(pid).cpu_s if pid is not None else float("nan")


def children() -> list[int]:
    """This process's direct children."""
    me = os.getpid()
    found: list[int] = []
    for entry in pathlib.Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        if parent == me:
            found.append(int(entry.name))
    return found


def pin(pid: int, cpus: set[int]) -> None:
    """Every thread of `pid` (grpc and Envoy run several) onto `cpus`; threads made later inherit it."""
    for task in pathlib.Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(ProcessLookupError):
            os.sched_setaffinity(int(task.name), cpus)


def pin_stacks(epps: Sequence[int]) -> dict[str, list[int]]:
    """The EPPs on the first allowed CPU, every other child and this client on the rest."""
    allowed = sorted(os.sched_getaffinity(0))
    if len(allowed) < 2:
        raise RuntimeError("--pin needs at least 2 CPUs")
    epp_cpus, rest = {allowed[0]}, set(allowed[1:])
    for pid in epps:
        pin(pid, epp_cpus)
    for pid in children():
        if pid not in epps:
            pin(pid, rest)
    pin(os.getpid(), rest)
    return {"epp": sorted(epp_cpus), "others": sorted(rest)}


def ext_proc_messages(stack: LocalStack) -> int:
    """Messages this stack's Envoy has sent to the EPP over ext_proc (Envoy's own counter)."""
    if stack.envoy is None:
        return 0
    text = stack.envoy.admin_get("/stats?filter=ext_proc.stream_msgs_sent$")
    return sum(int(line.rsplit(":", 1)[1]) for line in text.splitlines() if ":" in line)


def trace_requests(seed: int) -> Iterator[Request]:
    """Endless requests: output lengths drawn from the Azure conversation trace, half streamed."""
    lengths = [
        min(MAX_TRACE_TOKENS, max(1, row.generated_tokens)) for row in read_trace(resolve_trace("azure-conv"))
    ]
    rng = random.Random(seed)
    index = 0
    while True:
        model = ADAPTERS[index % len(ADAPTERS)] if index % 5 else "base"
        yield Request(model, rng.choice(lengths), stream=index % 2 == 0)
        index += 1


def fixed_requests(max_tokens: int, stream: bool) -> Iterator[Request]:
    index = 0
    while True:
        yield Request(ADAPTERS[index % len(ADAPTERS)], max_tokens, stream)
        index += 1


async def send(
    session: aiohttp.ClientSession, url: str, request: Request, index: int, samples: Samples
) -> None:
    started = time.perf_counter()
    try:
        async with session.post(
            url, data=request.body(index), headers={"content-type": "application/json"}
        ) as response:
            data = await response.read()
            status = response.status
    except (aiohttp.ClientError, TimeoutError):
        status, data = 0, b""
    if status == 200 and request.stream and not data.endswith(b"data: [DONE]\n\n"):
        status = -1  # cut short
    samples.add(status, time.perf_counter() - started, request.max_tokens)


async def open_loop(urls: Sequence[str], rate: float, duration_s: float, seed: int) -> list[Samples]:
    """`rate` requests/s to each URL for `duration_s`, whatever the replies' pace (in flight capped)."""
    results = [Samples() for _ in urls]
    timeout = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S)
    connector = aiohttp.TCPConnector(limit=0)
    pending: set[asyncio.Task[None]] = set()
    source = trace_requests(seed)
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
        start = time.perf_counter()
        for index in range(int(rate * duration_s)):
            delay = start + index / rate - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            request = next(source)
            for url, samples in zip(urls, results, strict=True):
                if len(pending) < 2000:
                    task = asyncio.create_task(send(session, url, request, index, samples))
                    pending.add(task)
                    task.add_done_callback(pending.discard)
                else:
                    samples.add(0, 0.0, 0)
        await asyncio.gather(*pending)
    return results


async def closed_loop(
    url: str, concurrency: int, requests: int, source: Iterator[Request]
) -> tuple[Samples, float]:
    samples = Samples()
    timeout = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S)
    counter = iter(range(requests))

    async def worker(session: aiohttp.ClientSession) -> None:
        for index in counter:
            await send(session, url, next(source), index, samples)

    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
        started = time.perf_counter()
        await asyncio.gather(*(worker(session) for _ in range(concurrency)))
        elapsed_s = time.perf_counter() - started
    return samples, elapsed_s


def stack_options(
    pods: int, routing: RoutingMode, process_responses: bool, tree: pathlib.Path | None = None
) -> StackOptions:
    sim = SimOptions(
        adapters=ADAPTERS,
        max_loras=4,
        max_num_seqs=256,
        time_to_first_token_s=0.0,
        inter_token_latency_s=0.001,
        lora_load_latency_s=0.0,
        extra_args=("--max-model-len", "8192"),
    )
    options = StackOptions(
        pods=pods,
        sim=sim,
        routing=routing,
        process_responses=process_responses,
        refresh_metrics_interval="100ms",  # `epp serve`'s default
        extra_serve_args=("--v", "1"),
    )
    if tree is None:
        return options
    # Another checkout's EPP: run from its own directory, so `-m epp` imports that tree.
    command = ("env", "-C", str(tree), f"PYTHONPATH={tree}", sys.executable, "-m", "epp")
    return dataclasses.replace(options, epp_command=command)


@dataclasses.dataclass(slots=True)
class EppUnderTest:
    name: str
    stack: LocalStack
    pid: int
    idle_cores: float = 0.0

    @property
    def url(self) -> str:
        return f"{self.stack.gateway_url}/v1/completions"

    async def measure_idle(self) -> None:
        """What the EPP spends with no traffic (scraping the pods), per second."""
        before = cpu_s(self.pid)
        await asyncio.sleep(IDLE_WINDOW_S)
        self.idle_cores = (cpu_s(self.pid) - before) / IDLE_WINDOW_S

    async def closed_loop(
        self, concurrency: int, requests: int, source: Iterator[Request]
    ) -> tuple[Samples, float, float, int]:
        """Samples, elapsed seconds, EPP CPU net of idle, ext_proc messages."""
        cpu_before, messages_before = cpu_s(self.pid), ext_proc_messages(self.stack)
        samples, elapsed_s = await closed_loop(self.url, concurrency, requests, source)
        cpu = cpu_s(self.pid) - cpu_before
        net = max(1e-9, cpu - self.idle_cores * elapsed_s)
        return samples, elapsed_s, net, ext_proc_messages(self.stack) - messages_before


async def by_length(epps: Sequence[EppUnderTest], requests: int) -> dict[str, dict[str, object]]:
    """CPU per request by response length. A stack whose EPP passes responses through spends ~100×
    more per long request, so it gets an eighth of the requests: enough to rise far above its
    idle CPU, while the default stack needs many to measure its small, length-free cost."""
    table: dict[str, dict[str, object]] = {}
    for max_tokens, stream in LENGTHS:
        label = f"{max_tokens} tokens{' streamed' if stream else ''}"
        row: dict[str, object] = {}
        for epp in epps:
            count = requests if epp.name == EPP_STACKS[0] else max(LENGTH_CONCURRENCY, requests // 8)
            samples, _, net_cpu, messages = await epp.closed_loop(
                LENGTH_CONCURRENCY, count, fixed_requests(max_tokens, stream)
            )
            row[epp.name] = {
                "requests": samples.served,
                "errors": samples.errors,
                "epp_cpu_ms_per_request": round(1000 * net_cpu / max(1, samples.served), 3),
                "ext_proc_messages_per_request": round(messages / max(1, samples.served), 1),
            }
        table[label] = row
    base = table[f"{LENGTHS[0][0]} tokens"]
    for row in table.values():
        for name, cell in row.items():
            assert isinstance(cell, dict)
            first = base[name]
            assert isinstance(first, dict)
            cell["ratio_to_8_tokens"] = round(
                float(cell["epp_cpu_ms_per_request"]) / max(1e-9, float(first["epp_cpu_ms_per_request"])), 2
            )
    return table


async def soak(
    epps: Sequence[EppUnderTest], direct_url: str, rate: float, duration_s: float, seed: int
) -> dict[str, object]:
    before = {epp.name: process_usage(epp.pid) for epp in epps}
    started = time.perf_counter()
    *through, direct = await open_loop([epp.url for epp in epps] + [direct_url], rate, duration_s, seed)
    elapsed_s = time.perf_counter() - started
    report: dict[str, object] = {
        "rate_per_stack": rate,
        "duration_s": round(elapsed_s, 2),
        "direct_p50_ms": round(direct.quantile_ms(0.5), 3),
        "direct_p99_ms": round(direct.quantile_ms(0.99), 3),
        "direct_errors": direct.errors,
    }
    for epp, samples in zip(epps, through, strict=True):
        after = process_usage(epp.pid)
        cpu = after.cpu_s - before[epp.name].cpu_s
        net = max(1e-9, cpu - epp.idle_cores * elapsed_s)
        report[epp.name] = {
            "requests": samples.served,
            "output_tokens": samples.tokens,
            "p50_ms": round(samples.quantile_ms(0.5), 3),
            "p99_ms": round(samples.quantile_ms(0.99), 3),
            "added_p50_ms": round(samples.quantile_ms(0.5) - direct.quantile_ms(0.5), 3),
            "added_p99_ms": round(samples.quantile_ms(0.99) - direct.quantile_ms(0.99), 3),
            "errors": samples.errors,
            "statuses": samples.statuses,
            "epp_cpu_cores": round(cpu / elapsed_s, 3),
            "epp_cpu_ms_per_request_net": round(1000 * net / max(1, samples.served), 3),
            "epp_cpu_us_per_output_token_net": round(1e6 * net / max(1, samples.tokens), 2),
            "epp_rps_per_cpu_s_net": round(samples.served / net, 1),
            "epp_rss_start_mib": round(before[epp.name].rss_bytes / 2**20, 1),
            "epp_rss_end_mib": round(after.rss_bytes / 2**20, 1),
        }
    return report


async def hot_path(
    epps: Sequence[EppUnderTest], direct: LocalStack, requests: int, seed: int
) -> dict[str, object]:
    report: dict[str, object] = {"concurrency": HOT_CONCURRENCY, "requests": requests}
    direct_envoy = direct.envoy.pid if direct.envoy is not None else None
    envoy_before = cpu_s(direct_envoy)
    direct_samples, direct_s = await closed_loop(
        f"{direct.gateway_url}/v1/completions", HOT_CONCURRENCY, requests, fixed_requests(1, False)
    )
    report["direct"] = {
        "rps": round(direct_samples.served / direct_s, 1),
        "envoy_cpu_ms_per_request": round(
            1000 * (cpu_s(direct_envoy) - envoy_before) / max(1, direct_samples.served), 3
        ),
    }
    for epp in epps:
        envoy_pid = epp.stack.envoy.pid if epp.stack.envoy is not None else None
        envoy_before, gross_before = cpu_s(envoy_pid), cpu_s(epp.pid)
        samples, elapsed_s, net, _ = await epp.closed_loop(
            HOT_CONCURRENCY, requests, fixed_requests(1, False)
        )
        gross = cpu_s(epp.pid) - gross_before
        mixed, _, mixed_net, _ = await epp.closed_loop(HOT_CONCURRENCY, requests // 4, trace_requests(seed))
        report[epp.name] = {
            "rps": round(samples.served / elapsed_s, 1),
            "errors": samples.errors + mixed.errors,
            "epp_idle_cpu_cores": round(epp.idle_cores, 3),
            "epp_cpu_ms_per_request": round(1000 * gross / max(1, samples.served), 3),
            "epp_rps_per_cpu_s": round(samples.served / max(1e-9, gross), 1),
            "epp_rps_per_cpu_s_net": round(samples.served / net, 1),
            "mixed_streamed_rps_per_cpu_s_net": round(mixed.served / mixed_net, 1),
            "envoy_cpu_ms_per_request": round(
                1000 * (cpu_s(envoy_pid) - envoy_before) / max(1, samples.served), 3
            ),
        }
    return report


async def one_connection(epps: Sequence[EppUnderTest], direct_url: str, requests: int) -> dict[str, object]:
    direct, _ = await closed_loop(direct_url, 1, requests, fixed_requests(1, False))
    report: dict[str, object] = {"requests": requests, "direct_p50_ms": round(direct.quantile_ms(0.5), 3)}
    for epp in epps:
        samples, _ = await closed_loop(epp.url, 1, requests, fixed_requests(1, False))
        report[epp.name] = {
            "p50_ms": round(samples.quantile_ms(0.5), 3),
            "added_p50_ms": round(samples.quantile_ms(0.5) - direct.quantile_ms(0.5), 3),
        }
    return report


async def run(args: argparse.Namespace) -> dict[str, object]:
    results: dict[str, object] = {}
    with contextlib.ExitStack() as stacks:
        epps: list[EppUnderTest] = []
        variants: list[tuple[str, bool, pathlib.Path | None]] = [
            (EPP_STACKS[0], False, None),
            (EPP_STACKS[1], True, None),
        ]
        if args.baseline_tree is not None:
            variants.append((BASELINE_STACK, True, args.baseline_tree.resolve()))
        for seed, (name, responses, tree) in enumerate(variants, start=1):
            stack = stacks.enter_context(
                LocalStack(stack_options(args.pods, RoutingMode.EPP, responses, tree), seed=seed)
            )
            # Started and ready: under `env`, the same pid has become the EPP's python by now.
            assert stack.epp_pid is not None
            epps.append(EppUnderTest(name, stack, stack.epp_pid))
        direct = stacks.enter_context(
            LocalStack(stack_options(args.pods, RoutingMode.ROUND_ROBIN, False), seed=len(variants) + 1)
        )
        direct_url = f"{direct.gateway_url}/v1/completions"
        if args.pin:
            results["pinned_cpus"] = pin_stacks([epp.pid for epp in epps])
        for epp in epps:  # warm-up: connections, adapters loaded, the access-log stream open
            await closed_loop(epp.url, 4, 100, fixed_requests(8, True))
        await closed_loop(direct_url, 4, 100, fixed_requests(8, True))
        for epp in epps:
            await epp.measure_idle()

        results["by_length"] = await by_length(epps, args.length_requests)
        if not args.skip_soak:
            results["soak"] = await soak(epps, direct_url, args.rate, args.duration_s, args.seed)
        results["hot_path"] = await hot_path(epps, direct, args.hot_requests, args.seed)
        results["one_connection"] = await one_connection(epps, direct_url, args.single_requests)
    return results


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--rate", type=float, default=8.0, help="requests/s to each stack in the soak")
    parser.add_argument("--duration-s", type=float, default=20.0, help="soak length in seconds")
    parser.add_argument("--pods", type=int, default=4)
    parser.add_argument(
        "--length-requests",
        type=int,
        default=256,
        help="requests per length through the default stack (an eighth through epp+responses)",
    )
    parser.add_argument("--hot-requests", type=int, default=2000)
    parser.add_argument("--single-requests", type=int, default=300)
    parser.add_argument("--seed", type=int, default=1, help="seed for the soak's output lengths")
    parser.add_argument("--pin", action="store_true", help="the EPPs on one CPU, everything else on the rest")
    parser.add_argument("--skip-soak", action="store_true", help="leave out the open-loop soak")
    parser.add_argument(
        "--baseline-tree",
        type=pathlib.Path,
        default=None,
        help="also run the EPP of this checkout (e.g. a `git worktree` of an earlier commit, with its "
        "epp/_proto built) with responses through it, as a fourth stack",
    )
    parser.add_argument("--json", type=pathlib.Path, default=None, help="also write the results here")
    args = parser.parse_args(argv)
    if not (0 < args.rate <= 2000 and 0 < args.duration_s <= 3600):
        parser.error("--rate must be in (0, 2000] and --duration-s in (0, 3600]")
    for name in ("length_requests", "hot_requests", "single_requests"):
        if not 0 < getattr(args, name) <= 1_000_000:
            parser.error(f"--{name.replace('_', '-')} must be in (0, 1000000]")
    results = asyncio.run(run(args))
    text = json.dumps(results, indent=2)
    print(text)
    if args.json is not None:
        args.json.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
