"""What the EPP costs on a real request path: CPU per request and per streamed token, added latency,
throughput per core, memory under soak. Real Envoy + `epp serve` + `epp sim` pods on loopback.

Run:  .venv/bin/python benchmarks/soak.py [--rate 8] [--duration-s 15] [--pods 4]
      [--length-requests 160] [--length-rate 16] [--hot-requests 2000] [--single-requests 300]
      [--seed 1] [--baseline-tree DIR] [--pin] [--skip-soak] [--json results.json]

Three stacks start side by side, each with its own sims (first token at once, 1 ms per further
token, so a streamed response reaches Envoy about one chunk per token, as vLLM's do):

- `epp`: Envoy as `epp envoy-config` writes it by default: the EPP sees the request only and
  learns how it ended from Envoy's gRPC access log;
- `epp+responses`: the same with `--process-responses`: every response chunk passes through
  the EPP (the former default, and what kgateway, Istio and Envoy AI Gateway configure);
- `direct`: the same Envoy with a plain round-robin cluster of its sims, no ext_proc;
- with `--baseline-tree DIR`, also `baseline+responses`: another checkout's EPP (an earlier
  commit's `git worktree`, with its `epp/_proto` built) with responses through it.

The EPPs scrape their pods every second (not every 100 ms, `epp serve`'s default): scraping busy
pods is the EPP's largest background cost and varies with their load, so at 100 ms it would drown
the per-request figures in noise. EPP CPU comes from /proc/<pid>/stat. It is reported net of the
EPP's background: before each
measurement the same workload goes straight to that stack's pods, and the EPP's CPU rate then
(scraping pods exactly as busy, routing nothing) is subtracted over the measured run's duration.
An idle-time figure would not do: scraping busy pods costs more, and would be charged to the
requests that keep them busy longest.

Phases, each bounded in count and time, the EPP stacks measured one after the other so each
CPU figure is that EPP's alone:

1. by length: `--length-requests` requests of 8 tokens (not streamed), 8, 256 and 1024 tokens
   (streamed) at `--length-rate` requests/s through the `epp` stack (an eighth as many at a
   quarter of the rate through the stacks whose EPP works ~100× more per long request): EPP CPU
   per request, the ext_proc messages Envoy sent per request (its own counter), and the ratio to
   the 8-token non-streamed request;
2. soak: open loop at `--rate` requests/s to every stack for `--duration-s`, half streamed, with
   output lengths drawn from the Azure LLM inference trace (conversation) shipped in
   `epp/tools/bench/data/`: P50/P99 latency and what the EPP adds to them, errors, EPP CPU per request
   and per output token, requests per EPP CPU-second, RSS at start and end;
3. hot path: `--hot-requests` short non-streamed requests at concurrency 16 through each EPP
   stack and direct, then a quarter as many of the soak's mixed streamed requests at concurrency
   64 (as fast as the sims here produce tokens), then short requests at the rate that run
   reached (CPU per request falls as load rises; this separates load from length): requests/s,
   requests per EPP CPU-second (gross, and net of the background), Envoy's CPU per request;
4. one connection: `--single-requests` sequential short requests on each stack: added P50.

Wall-clock figures depend on the machine (the EPPs, the Envoys, the sims and this client share
its cores); CPU per request much less. `--pin` puts the EPPs on the first allowed CPU and
everything else on the rest.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import functools
import json
import os
import pathlib
import random
import sys
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence

from epp.tools import loadgen
from epp.tools.bench.workload import read_trace, resolve_trace
from epp.tools.envoy.bootstrap import RoutingMode
from epp.tools.localstack import LocalStack, SimOptions, StackOptions

ADAPTERS = tuple(f"adapter-{i}" for i in range(4))
CLOCK_TICKS_PER_S = os.sysconf("SC_CLK_TCK")
HOT_CONCURRENCY = 16
MIXED_CONCURRENCY = 64  # streamed requests last ~0.3 s: as many in flight as the sims can feed here
REQUEST_TIMEOUT_S = 60.0
MAX_TRACE_TOKENS = 2048  # longer outputs are capped (0.1 % of the trace)
LENGTHS = ((8, False), (8, True), (256, True), (1024, True))
EPP_STACKS = ("epp", "epp+responses")
BASELINE_STACK = "baseline+responses"  # --baseline-tree: another checkout's EPP, responses through it


@dataclasses.dataclass(slots=True)
class Samples:
    latencies_s: list[float] = dataclasses.field(default_factory=list)
    errors: int = 0
    tokens: int = 0
    statuses: dict[int, int] = dataclasses.field(default_factory=dict)

    @classmethod
    def of(cls, answers: Sequence[loadgen.Answer]) -> Samples:
        """Answers as counted here: 200 and whole is served; a 200 cut short counts as status -1."""
        samples = cls()
        for answer in answers:
            status = -1 if answer.status == 200 and not answer.whole else answer.status
            samples.statuses[status] = samples.statuses.get(status, 0) + 1
            if status == 200:
                samples.latencies_s.append(answer.e2e_s)
                samples.tokens += answer.completion_tokens
            else:
                samples.errors += 1
        return samples

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


def _request(index: int, model: str, max_tokens: int, stream: bool) -> loadgen.Request:
    return loadgen.Request.completion(model, max_tokens, stream=stream, prompt=f"request {index}: say hello")


def trace_requests(seed: int) -> Iterator[loadgen.Request]:
    """Endless requests: output lengths drawn from the Azure conversation trace, half streamed."""
    lengths = [
        min(MAX_TRACE_TOKENS, max(1, row.generated_tokens)) for row in read_trace(resolve_trace("azure-conv"))
    ]
    rng = random.Random(seed)
    index = 0
    while True:
        model = ADAPTERS[index % len(ADAPTERS)] if index % 5 else "base"
        yield _request(index, model, rng.choice(lengths), stream=index % 2 == 0)
        index += 1


def fixed_requests(max_tokens: int, stream: bool) -> Iterator[loadgen.Request]:
    index = 0
    while True:
        yield _request(index, ADAPTERS[index % len(ADAPTERS)], max_tokens, stream)
        index += 1


async def open_loop(
    targets: Sequence[Sequence[str]], rate: float, count: int, source: Iterator[loadgen.Request]
) -> list[Samples]:
    """`count` requests at `rate` requests/s to each target (its base URLs in turn), whatever the
    replies' pace (in flight capped)."""
    schedule = loadgen.at_rate(rate, [next(source) for _ in range(count)])
    runs = await asyncio.gather(
        *(
            loadgen.open_loop(tuple(urls), schedule, timeout_s=REQUEST_TIMEOUT_S, lead_s=0.0)
            for urls in targets
        )
    )
    return [Samples.of(answers) for answers in runs]


async def closed_loop(
    urls: Sequence[str], concurrency: int, requests: int, source: Iterator[loadgen.Request]
) -> tuple[Samples, float]:
    """`requests` requests from `concurrency` clients, to `urls` (base URLs) in turn; samples and
    seconds taken."""
    batch = [next(source) for _ in range(requests)]
    started = time.perf_counter()
    answers = await loadgen.closed_loop(
        tuple(urls), batch, concurrency=concurrency, timeout_s=REQUEST_TIMEOUT_S
    )
    return Samples.of(answers), time.perf_counter() - started


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
        # Every second, not `epp serve`'s 100 ms: scraping busy pods is the EPP's largest background
        # cost (`benchmarks/scrape_cost.py`) and varies with their load; at 1 s it stays small next
        # to what the requests cost, so the figures net of it are steady.
        refresh_metrics_interval="1s",
        extra_serve_args=("--v", "1"),
    )
    if tree is None:
        return options
    # Another checkout's EPP: run from its own directory, so `-m epp` imports that tree.
    command = ("env", "-C", str(tree), f"PYTHONPATH={tree}", sys.executable, "-m", "epp")
    return dataclasses.replace(options, epp_command=command, drain_period=None)


@dataclasses.dataclass(frozen=True, slots=True)
class Measured:
    """One workload through a stack's gateway, with the EPP CPU it cost beyond its background."""

    samples: Samples
    elapsed_s: float
    epp_cpu_s: float  # gross
    background_cores: float  # the EPP's CPU while the same workload went straight to its pods
    ext_proc_messages: int

    @property
    def net_cpu_s(self) -> float:
        return max(1e-9, self.epp_cpu_s - self.background_cores * self.elapsed_s)

    def ms_per_request(self) -> float:
        return round(1000 * self.net_cpu_s / max(1, self.samples.served), 3)

    def per_cpu_second(self) -> float:
        return round(self.samples.served / self.net_cpu_s, 1)


@dataclasses.dataclass(slots=True)
class EppUnderTest:
    name: str
    stack: LocalStack
    pid: int

    @property
    def url(self) -> str:
        return self.stack.gateway_url

    @property
    def pod_urls(self) -> list[str]:
        return [pod.url for pod in self.stack.pods]

    async def measure(self, load: Callable[[Sequence[str]], Awaitable[Samples]]) -> Measured:
        """`load` straight to the pods (the EPP only scrapes them, as busy as they will be), then
        through the gateway; the first run's EPP CPU rate is the background of the second. Scraping
        busy pods costs more than idle ones, so an idle-time figure would charge longer requests
        for the scrapes that happen while they run."""
        before, started = cpu_s(self.pid), time.perf_counter()
        await load(self.pod_urls)
        background = (cpu_s(self.pid) - before) / (time.perf_counter() - started)
        before, messages, started = cpu_s(self.pid), ext_proc_messages(self.stack), time.perf_counter()
        samples = await load([self.url])
        return Measured(
            samples,
            time.perf_counter() - started,
            cpu_s(self.pid) - before,
            background,
            ext_proc_messages(self.stack) - messages,
        )


def closed(
    concurrency: int, requests: int, source: Callable[[], Iterator[loadgen.Request]]
) -> Callable[[Sequence[str]], Awaitable[Samples]]:
    """A closed loop of `requests` at `concurrency`, each run drawing from a fresh `source()`."""

    async def load(urls: Sequence[str]) -> Samples:
        samples, _ = await closed_loop(urls, concurrency, requests, source())
        return samples

    return load


def opened(
    rate: float, requests: int, source: Callable[[], Iterator[loadgen.Request]]
) -> Callable[[Sequence[str]], Awaitable[Samples]]:
    """An open loop of `requests` at `rate` per second, each run drawing from a fresh `source()`."""

    async def load(urls: Sequence[str]) -> Samples:
        [samples] = await open_loop([urls], rate, requests, source())
        return samples

    return load


async def by_length(epps: Sequence[EppUnderTest], requests: int, rate: float) -> dict[str, dict[str, object]]:
    """CPU per request by response length, every length at the same request rate: Envoy flushes
    its access log every 100 ms, so how many entries share a message depends on how often
    requests end, not on how long they are. A stack whose EPP passes responses through spends
    ~100× more per long request: it gets an eighth of the requests at a quarter of the rate,
    enough to rise far above its background without saturating it."""
    table: dict[str, dict[str, object]] = {}
    for max_tokens, stream in LENGTHS:
        label = f"{max_tokens} tokens{' streamed' if stream else ''}"
        row: dict[str, object] = {}
        for epp in epps:
            source = functools.partial(fixed_requests, max_tokens, stream)
            if epp.name == EPP_STACKS[0]:
                load = opened(rate, requests, source)
            else:
                load = opened(rate / 4, max(8, requests // 8), source)
            measured = await epp.measure(load)
            row[epp.name] = {
                "requests": measured.samples.served,
                "errors": measured.samples.errors,
                "epp_cpu_ms_per_request": measured.ms_per_request(),
                "ext_proc_messages_per_request": round(
                    measured.ext_proc_messages / max(1, measured.samples.served), 1
                ),
                "background_epp_cpu_cores": round(measured.background_cores, 3),
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
    """The open loop straight to every EPP stack's pods first (each EPP's background while its pods
    are this busy), then through every stack at once, direct included."""
    count = int(rate * duration_s)
    before = {epp.name: cpu_s(epp.pid) for epp in epps}
    started = time.perf_counter()
    await open_loop([epp.pod_urls for epp in epps], rate, count, trace_requests(seed))
    control_s = time.perf_counter() - started
    background = {epp.name: (cpu_s(epp.pid) - before[epp.name]) / control_s for epp in epps}

    usage = {epp.name: process_usage(epp.pid) for epp in epps}
    started = time.perf_counter()
    *through, direct = await open_loop(
        [[epp.url] for epp in epps] + [[direct_url]], rate, count, trace_requests(seed)
    )
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
        cpu = after.cpu_s - usage[epp.name].cpu_s
        net = max(1e-9, cpu - background[epp.name] * elapsed_s)
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
            "background_epp_cpu_cores": round(background[epp.name], 3),
            "epp_cpu_ms_per_request_net": round(1000 * net / max(1, samples.served), 3),
            "epp_cpu_us_per_output_token_net": round(1e6 * net / max(1, samples.tokens), 2),
            "epp_rps_per_cpu_s_net": round(samples.served / net, 1),
            "epp_rss_start_mib": round(usage[epp.name].rss_bytes / 2**20, 1),
            "epp_rss_end_mib": round(after.rss_bytes / 2**20, 1),
        }
    return report


async def hot_path(
    epps: Sequence[EppUnderTest], direct: LocalStack, requests: int, seed: int
) -> dict[str, object]:
    """Short requests at concurrency 16, then the soak's mixed streamed workload the same way."""
    report: dict[str, object] = {"concurrency": HOT_CONCURRENCY, "requests": requests}
    direct_envoy = direct.envoy.pid if direct.envoy is not None else None
    envoy_before = cpu_s(direct_envoy)
    direct_samples, direct_s = await closed_loop(
        [direct.gateway_url], HOT_CONCURRENCY, requests, fixed_requests(1, False)
    )
    report["direct"] = {
        "rps": round(direct_samples.served / direct_s, 1),
        "envoy_cpu_ms_per_request": round(
            1000 * (cpu_s(direct_envoy) - envoy_before) / max(1, direct_samples.served), 3
        ),
    }
    for epp in epps:
        envoy_pid = epp.stack.envoy.pid if epp.stack.envoy is not None else None
        envoy_before = cpu_s(envoy_pid)
        short = await epp.measure(
            closed(HOT_CONCURRENCY, requests, functools.partial(fixed_requests, 1, False))
        )
        envoy_cpu = cpu_s(envoy_pid) - envoy_before
        mixed = await epp.measure(
            closed(MIXED_CONCURRENCY, requests // 4, functools.partial(trace_requests, seed))
        )
        # Short requests at the rate the mixed run reached: what the EPP spends per request at
        # that load whatever the responses are (CPU per request falls as load rises).
        mixed_rps = mixed.samples.served / mixed.elapsed_s
        same_rate = await epp.measure(
            opened(mixed_rps, mixed.samples.served, functools.partial(fixed_requests, 1, False))
        )
        report[epp.name] = {
            "rps": round(short.samples.served / short.elapsed_s, 1),
            "errors": short.samples.errors + mixed.samples.errors,
            "epp_cpu_ms_per_request": round(1000 * short.epp_cpu_s / max(1, short.samples.served), 3),
            "epp_rps_per_cpu_s": round(short.samples.served / max(1e-9, short.epp_cpu_s), 1),
            "epp_rps_per_cpu_s_net": short.per_cpu_second(),
            "mixed_streamed_rps": round(mixed_rps, 1),
            "mixed_streamed_epp_cpu_ms_per_request_net": mixed.ms_per_request(),
            "mixed_streamed_rps_per_cpu_s_net": mixed.per_cpu_second(),
            "short_at_mixed_rate_epp_cpu_ms_per_request_net": same_rate.ms_per_request(),
            "envoy_cpu_ms_per_request": round(1000 * envoy_cpu / max(1, short.samples.served), 3),
        }
    return report


async def one_connection(epps: Sequence[EppUnderTest], direct_url: str, requests: int) -> dict[str, object]:
    direct, _ = await closed_loop([direct_url], 1, requests, fixed_requests(1, False))
    report: dict[str, object] = {"requests": requests, "direct_p50_ms": round(direct.quantile_ms(0.5), 3)}
    for epp in epps:
        samples, _ = await closed_loop([epp.url], 1, requests, fixed_requests(1, False))
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
        direct_url = direct.gateway_url
        if args.pin:
            results["pinned_cpus"] = pin_stacks([epp.pid for epp in epps])
        for epp in epps:  # warm-up: connections, adapters loaded, the access-log stream open
            await closed_loop([epp.url], 4, 100, fixed_requests(8, True))
        await closed_loop([direct_url], 4, 100, fixed_requests(8, True))

        results["by_length"] = await by_length(epps, args.length_requests, args.length_rate)
        if not args.skip_soak:
            results["soak"] = await soak(epps, direct_url, args.rate, args.duration_s, args.seed)
        results["hot_path"] = await hot_path(epps, direct, args.hot_requests, args.seed)
        results["one_connection"] = await one_connection(epps, direct_url, args.single_requests)
    return results


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--rate", type=float, default=8.0, help="requests/s to each stack in the soak")
    parser.add_argument(
        "--duration-s",
        type=float,
        default=15.0,
        help="soak length in seconds (run twice: to the pods, then through)",
    )
    parser.add_argument("--pods", type=int, default=4)
    parser.add_argument(
        "--length-requests",
        type=int,
        default=160,
        help="requests per length through the default stack (an eighth through the others)",
    )
    parser.add_argument(
        "--length-rate",
        type=float,
        default=16.0,
        help="requests/s of each length through the default stack (a quarter through the others)",
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
