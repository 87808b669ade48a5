"""The overload scenarios live: `tenant-flood` and `priority-mix`, scaled to a 2-core machine, through
real Envoy, `epp serve --policy NAME` and `epp sim` pods on loopback, beside the simulator.

Run:  .venv/bin/python -m benchmarks.overload_live [--out DIR] [--policies a,b] [--seed 1] [--sim-only]

Both packaged scenarios ask what a policy does when more arrives than the pods can serve
(`epp/tools/bench/scenarios/tenant-flood.yaml`, `priority-mix.yaml`). `epp bench` answers in
simulated time; this answers with the real request path, so that what the EPP and Envoy really
do under overload (refusals, their bodies and latency, queueing in the EPP) is measured, not
modelled. The same seeded workload then runs in the simulator (`epp.tools.bench.events.simulate`,
the pods costed by `epp sim`'s own latencies), and the figures come from the bench's own
`runner.summarize`, live timings filled into its `SimRequest`s, so the two columns mean the same.

Scaling (`Scale`; the 70B fleets of the packaged files cannot run here):

- Pods: 4 `epp sim` (as both files), `--max-num-seqs 4`, `--max-loras 8` (a slot for every adapter,
  as tenant-flood: the overload is GPU time, not LoRA slots), every adapter registered at start,
  `--time-to-first-token 80ms --inter-token-latency 80ms`; outputs 4-16 tokens, prompts 8-64
  tokens plus a 32-token system prompt. A request then takes ≈ 0.8 s, so the fleet saturates at
  ≈ 11.4 req/s (what it finishes per second when offered 12-16) with a few tokens a request: what
  limits it is the pods' simulated GPU time (sleeps), not CPU in Envoy, the EPP or the client.
  EPP and Envoy CPU are measured per live run and printed (`cpu`), to show they are not the
  bottleneck.
- Capacity: 10 req/s, 0.88 × saturation, where the packaged priority-mix puts its 15 req/s
  (0.89 × its 16.9). Both scenarios keep their load relative to it: tenant-flood 7 req/s (70 %)
  with adapter-002 at 10× for the flood (≈ 14.8 req/s, 1.48×), priority-mix 15 req/s (1.5×).
- SLO: TTFT ≤ 1.5 s, 19× these pods' unloaded P50 TTFT (80 ms), the ratio of the packaged
  tenant-flood's 1 s to its fleet's 52 ms (priority-mix: 10×, 1 s to 100 ms).
- Time: tenant-flood 18 s (first 2 s not measured), the flood from 5 s for 7 s; priority-mix 15 s
  (first 2 s not measured): a thirteenth and a twentieth of the packaged runs, so that five
  policies, the flood's no-flood twin and both scenarios fit in ≈ 6 minutes. Samples are small
  (≈ 170-200 measured requests per run): read a P99 as the second-worst request.

One fleet serves every run: the sims and Envoy start once, and for each policy the EPP is
restarted with `--policy NAME` (round-robin too: `epp serve --policy round-robin`, as
`epp bench --live` runs it). Each policy runs tenant-flood, its no-flood twin (the same steady
requests; the ratio's denominator) and priority-mix; before each run the pods are idle. The EPP's
queue wait per request comes from its decision log (`/debug/decisions`, keyed by the request's
`x-request-id`); a refusal's latency is the client's time to the 429/503, and every refusal's body
is checked to be an OpenAI-style JSON error carrying its status.

A sim sleeps in real time, so on a busy machine it steps slower than its flags say, and the live
fleet saturates lower than the simulated one. Before the runs a probe measures the idle pods' real
step time and what Envoy and the EPP add to TTFT; the simulator then runs a third time with the
pods' costs slowed by the probed factor (`sim (probed)`), so that a live-simulated difference the
slower pods explain is told from one they do not. Under each table, the order of the policies by
goodput and by the scenario's headline figure, live and simulated, and whether they agree
(differences within the noise of runs this short count as ties).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import math
import os
import pathlib
import sys
import time
import urllib.request
from collections.abc import Callable, Sequence
from importlib import resources
from typing import Any, TextIO

import yaml

from epp.tools import loadgen
from epp.tools.bench import runner, workload
from epp.tools.bench.events import RunResult, request_headers
from epp.tools.bench.model import SimRequest
from epp.tools.bench.runner import PolicySummary
from epp.tools.bench.scenario import Scenario, parse
from epp.tools.localstack import POOL_NAME, LocalStack, SimOptions, StackError, StackOptions

POLICIES = ("default", "round-robin", "least-queue", "gie-v1", "gie-v0.3")
FLOOD, MIX = "tenant-flood", "priority-mix"
REFUSALS = (429, 503)
BASE_MODEL = "base"


@dataclasses.dataclass(frozen=True, slots=True)
class Scale:
    """How the packaged scenarios shrink to this machine (the module docstring says why)."""

    pods: int = 4
    max_num_seqs: int = 4
    max_loras: int = 8
    time_to_first_token_s: float = 0.08
    inter_token_latency_s: float = 0.08
    prompt_tokens: tuple[int, int] = (8, 64)
    output_tokens: tuple[int, int] = (4, 16)
    system_prompt_tokens: int = 32
    slo_ttft_s: float = 1.5
    capacity_rps: float = 10.0
    flood_duration_s: float = 18.0
    flood_warmup_s: float = 2.0
    flood_at_s: float = 5.0
    flood_for_s: float = 7.0
    mix_duration_s: float = 15.0
    mix_warmup_s: float = 2.0
    scrape_interval_s: float = 0.1  # the EPP's --refresh-metrics-interval, and the simulator's
    request_timeout_s: float = 30.0  # a request not answered by then counts as never served

    def sim_options(self, adapters: tuple[str, ...]) -> SimOptions:
        """The `epp sim` flags; `sim_cost` below gives the simulator the same costs."""
        return SimOptions(
            base_model=BASE_MODEL,
            adapters=adapters,
            max_loras=self.max_loras,
            max_cpu_loras=self.max_loras,
            max_num_seqs=self.max_num_seqs,
            time_to_first_token_s=self.time_to_first_token_s,
            inter_token_latency_s=self.inter_token_latency_s,
        )

    def sim_cost(self) -> dict[str, float]:
        """`epp sim`'s cost model for the simulator: these flags, its defaults for the rest."""
        return {
            "time_to_first_token_s": self.time_to_first_token_s,
            "inter_token_latency_s": self.inter_token_latency_s,
            "lora_load_latency_s": SimOptions().lora_load_latency_s,
        }


# -- scenarios --------------------------------------------------------------------------------------


def _packaged(name: str) -> dict[str, Any]:
    text = (resources.files("epp.tools.bench") / "scenarios" / f"{name}.yaml").read_text(encoding="utf-8")
    document: dict[str, Any] = yaml.safe_load(text)
    return document


def scaled(name: str, scale: Scale, seed: int) -> Scenario:
    """The packaged scenario `name` with its fleet, lengths, rate, times and SLO scaled; its
    adapters, popularity, tenants, flood factor and priority mix stay as the file has them."""
    doc = _packaged(name)
    doc.pop("model", None)
    doc["sim_cost"] = scale.sim_cost()
    doc["pods"] = {
        "replicas": scale.pods,
        "max_loras": scale.max_loras,
        "max_cpu_loras": scale.max_loras,
        "max_num_seqs": scale.max_num_seqs,
        "lora_modules": "all",
    }
    doc["adapters"]["system_prompt_tokens"] = scale.system_prompt_tokens
    doc["lengths"] = {"prompt_tokens": list(scale.prompt_tokens), "output_tokens": list(scale.output_tokens)}
    doc["slo"]["ttft_s"] = scale.slo_ttft_s
    doc["scrape_interval_s"] = scale.scrape_interval_s
    doc["seed"] = seed
    if name == FLOOD:
        doc["arrivals"]["rate_rps"] = 0.7 * scale.capacity_rps
        doc["duration_s"], doc["warmup_s"] = scale.flood_duration_s, scale.flood_warmup_s
        doc["flood"] |= {"at_s": scale.flood_at_s, "duration_s": scale.flood_for_s}
    else:
        doc["arrivals"]["rate_rps"] = 1.5 * scale.capacity_rps
        doc["duration_s"], doc["warmup_s"] = scale.mix_duration_s, scale.mix_warmup_s
    return parse(doc)


def objectives_yaml(scenario: Scenario, pool: str) -> str:
    """The scenario's objectives as the pool file's InferenceObjectives (what the simulator's
    `runner.inference_objectives` gives its Director)."""
    return "---\n".join(
        "apiVersion: inference.networking.x-k8s.io/v1alpha2\nkind: InferenceObjective\n"
        f"metadata:\n  name: {c.objective}\nspec:\n  priority: {c.priority}\n  poolRef:\n    name: {pool}\n"
        for c in scenario.workload.priorities
    )


# -- figures ----------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class LiveCosts:
    """What only a live run has: what the EPP and Envoy spent, and what its refusals looked like."""

    epp_cpu: float = math.nan  # CPU seconds per wall second during the run
    envoy_cpu: float = math.nan
    bad_refusals: tuple[str, ...] = ()  # refusals whose body was not a JSON error with their status


@dataclasses.dataclass(frozen=True, slots=True)
class Probe:
    """The idle fleet measured before the runs: how fast the live pods really step (a sim sleeps
    in real time on a shared machine, so it runs somewhat slower than its flags), and what Envoy
    and the EPP add to a request's first token."""

    set_step_s: float  # --inter-token-latency
    step_s: float  # P50 per decode step of a lone request, straight to a pod
    direct_ttft_s: float  # P50 TTFT straight to a pod
    gateway_ttft_s: float  # P50 TTFT through Envoy and the EPP

    def line(self) -> str:
        slower = self.step_s / self.set_step_s - 1.0
        added = (self.gateway_ttft_s - self.direct_ttft_s) * 1000
        return (
            f"Probe of the idle fleet: a pod steps in {self.step_s * 1000:.0f}ms for "
            f"{self.set_step_s * 1000:g}ms set ({slower:+.0%}: the live pods are that much slower than the "
            f"simulated ones); TTFT P50 {self.direct_ttft_s * 1000:.0f}ms straight to a pod, "
            f"{self.gateway_ttft_s * 1000:.0f}ms through Envoy and the EPP ({added:+.0f}ms)."
        )


@dataclasses.dataclass(frozen=True, slots=True)
class Extras:
    """What `PolicySummary` does not hold: refusal latencies, failures, and the live run's costs."""

    refusal_p50_s: float = math.nan  # arrival to the 429/503, over measured refused requests
    refusal_p99_s: float = math.nan
    lowest_refusal_p99_s: float = math.nan  # the same, for the lowest-priority objective (Sheddable)
    errors: int = 0  # answered with neither 200 nor a refusal, or not at all
    # Requests (whenever they arrived) finished per second of the measured arrival window: what the
    # pods delivered; below the offered rate while they are saturated.
    done_rps: float = math.nan
    live: LiveCosts = LiveCosts()


@dataclasses.dataclass(frozen=True, slots=True)
class Row:
    policy: str
    run: str  # "live" or "sim"
    summary: PolicySummary
    extras: Extras


def extras_of(scenario: Scenario, result: RunResult, live: LiveCosts) -> Extras:
    """Refusal latencies and failures over the measured requests of `result`."""
    measured = [r for r in result.requests if r.arrival_s >= scenario.warmup_s]
    refused = [r for r in measured if r.rejected and r.refused_s is not None]
    lowest = min(scenario.workload.priorities, key=lambda c: c.priority, default=None)
    lowest_refused = [r for r in refused if lowest is not None and r.objective == lowest.objective]
    waits = [r.refused_s - r.arrival_s for r in refused if r.refused_s is not None]
    start, end = scenario.warmup_s, result.arrivals_end_s
    done = sum(1 for r in result.requests if r.finish_s is not None and start <= r.finish_s <= end)
    lowest_waits = [r.refused_s - r.arrival_s for r in lowest_refused if r.refused_s is not None]
    return Extras(
        refusal_p50_s=loadgen.percentile(waits, 0.5),
        refusal_p99_s=loadgen.percentile(waits, 0.99),
        lowest_refusal_p99_s=loadgen.percentile(lowest_waits, 0.99),
        errors=sum(1 for r in measured if not r.rejected and r.first_token_s is None),
        done_rps=done / (end - start) if end > start else math.nan,
        live=live,
    )


RunFn = Callable[[Scenario, str], tuple[RunResult, LiveCosts]]  # (scenario, tag) -> the run


def figures(scenario: Scenario, policy: str, run: RunFn, label: str) -> Row:
    """One policy's row, as `runner.run_bench` computes it: the run, and for a flood its no-flood
    twin's steady P99."""
    result, live = run(scenario, "main")
    summary = runner.summarize_scenario(scenario, result)
    adapter = scenario.workload.flood_adapter
    if adapter is not None:
        calm = runner.without_flood(scenario)
        calm_result, _ = run(calm, "calm")
        calm_summary = runner.summarize_scenario(calm, calm_result, flood_adapter=adapter)
        summary = dataclasses.replace(summary, steady_ttft_p99_no_flood_s=calm_summary.steady_ttft_p99_s)
    return Row(policy, label, summary, extras_of(scenario, result, live))


def simulated(scenario: Scenario, policy: str, label: str = "sim") -> Row:
    def run(s: Scenario, _tag: str) -> tuple[RunResult, LiveCosts]:
        return runner.run_policy(s, policy), LiveCosts()

    return figures(scenario, policy, run, label)


# -- the live stack ---------------------------------------------------------------------------------


def _cpu_s(pid: int | None) -> float:
    """CPU seconds (user + system, every thread) process `pid` has used; NaN when unknown."""
    if pid is None:
        return math.nan
    try:
        fields = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return math.nan
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _get(url: str, timeout_s: float = 10.0) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout_s) as response:
        body: bytes = response.read()
    return body


def _metric_sum(text: str, name: str, **labels: str) -> float:
    """The sum of the samples of `name` whose labels include `labels`, read line by line (a full
    exposition parse of a sim's 45 KB page takes a tenth of a second on this machine)."""
    total = 0.0
    wanted = [f'{key}="{value}"' for key, value in labels.items()]
    for line in text.splitlines():
        if line.startswith((name + "{", name + " ")) and all(w in line for w in wanted):
            total += float(line.rsplit(" ", 1)[1])
    return total


def _bounded_wait(check: Callable[[], bool], within_s: float, interval_s: float = 0.1) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(interval_s)
    return False


def pods_idle(stack: LocalStack) -> bool:
    """No request running or waiting on any pod (the last run's tail is gone)."""
    for pod in stack.pods:
        text = _get(f"{pod.url}/metrics").decode()
        busy = _metric_sum(text, "vllm:num_requests_running") + _metric_sum(text, "vllm:num_requests_waiting")
        if busy > 0:
            return False
    return True


def check_refusal(answer: loadgen.Answer) -> str | None:
    """None when a refusal's body is an OpenAI-style JSON error carrying its status, else why not."""
    try:
        error = json.loads(answer.body)["error"]
        code = int(error["code"])
        message = str(error["message"])
    except (ValueError, KeyError, TypeError):
        return f"{answer.status}: not a JSON error: {answer.body[:120]!r}"
    if code != answer.status or not message:
        return f"{answer.status}: error code {code}, message {message!r}"
    return None


class LiveFleet:
    """The sims and Envoy of every live run; the EPP in front of them is restarted per policy."""

    def __init__(
        self, scale: Scale, adapters: tuple[str, ...], objectives: str, *, seed: int, log: TextIO
    ) -> None:
        self.scale = scale
        self.log = log
        self.adapters = adapters
        options = StackOptions(
            pods=scale.pods,
            sim=scale.sim_options(adapters),
            policy=POLICIES[0],
            refresh_metrics_interval=f"{round(scale.scrape_interval_s * 1000)}ms",
            extra_serve_args=("--decision-log-size", "20000", "--grace-period", "0s"),
            extra_pool_yaml=objectives,
        )
        self.stack = LocalStack(options, seed=seed)
        self.policy: str | None = None

    def __enter__(self) -> LiveFleet:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stack.stop()

    def serve(self, policy: str) -> None:
        """`epp serve --policy policy` in front of the pods, warmed: Envoy's access log reaches it
        (until then it cannot tell when a request ends) and every adapter has run on the pods."""
        stack = self.stack
        if self.policy is None:
            stack.options = dataclasses.replace(stack.options, policy=policy)
            stack.start(timeout_s=90.0)
        elif policy != self.policy:
            slot = stack.epp_slot
            assert slot is not None
            if slot.process is not None:
                slot.process.stop()
            stack.options = dataclasses.replace(stack.options, policy=policy)
            stack.start_epp_slot(slot, timeout_s=60.0)
        self.policy = policy
        warm = [
            (0.02 * i, loadgen.Request.completion(adapter, 1, prompt="warm up"))
            for i, adapter in enumerate(self.adapters * 2)
        ]
        asyncio.run(loadgen.open_loop((stack.gateway_url,), warm, timeout_s=10.0))

        def logged() -> bool:
            text = _get(f"http://127.0.0.1:{stack.epp_metrics_port}/metrics").decode()
            return _metric_sum(text, "inference_extension_request_finished_total", source="access-log") > 0

        _bounded_wait(logged, 10.0)

    def probe(self, tokens: int = 9, rounds: int = 2) -> Probe:
        """On the idle fleet: `rounds` lone requests of `tokens` on every pod at once, straight to
        it (its step time while all the pods step, as in the runs), then 1-token requests
        straight to each pod and through the gateway, alternately (what Envoy and the EPP add)."""
        stack = self.stack
        _bounded_wait(lambda: pods_idle(stack), 30.0)
        long = loadgen.Request.completion(self.adapters[0], tokens, stream=True)
        short = loadgen.Request.completion(self.adapters[0], 1, stream=True)

        async def every_pod() -> list[loadgen.Answer]:
            async def lone(url: str) -> list[loadgen.Answer]:
                return [await loadgen.send(session, url, long) for _ in range(rounds)]

            async with loadgen.client(timeout_s=30.0) as session:
                answers = await asyncio.gather(*(lone(pod.url) for pod in stack.pods))
            return [a for per_pod in answers for a in per_pod if a.whole]

        steps = asyncio.run(every_pod())
        direct, through = [], []
        for pod in stack.pods:
            direct.append(loadgen.send_one(pod.url, short))
            through.append(loadgen.send_one(stack.gateway_url, short))
        return Probe(
            set_step_s=self.scale.inter_token_latency_s,
            step_s=loadgen.percentile([(a.e2e_s - a.ttft_s) / (tokens - 1) for a in steps], 0.5),
            direct_ttft_s=loadgen.percentile([a.ttft_s for a in direct if a.whole], 0.5),
            gateway_ttft_s=loadgen.percentile([a.ttft_s for a in through if a.whole], 0.5),
        )

    def run(self, scenario: Scenario, tag: str) -> tuple[RunResult, LiveCosts]:
        """The scenario's requests, on schedule, through Envoy; each filled in with what its
        client saw and the queue wait the EPP logged for it."""
        stack = self.stack
        assert self.policy is not None and stack.envoy is not None
        _bounded_wait(lambda: pods_idle(stack), 30.0)
        requests = workload.generate(scenario.workload, scenario.seed)
        prefix = f"{scenario.name}-{self.policy}-{tag}"
        schedule = [
            (
                r.arrival_s,
                loadgen.Request.completion(
                    r.adapter or BASE_MODEL,
                    r.output_tokens,
                    stream=True,
                    prompt=workload.prompt_text(r),
                    headers={**request_headers(r), "x-request-id": f"{prefix}-{r.index}"},
                ),
            )
            for r in requests
        ]
        pids = (stack.epp_pid, stack.envoy.pid)
        cpu_before = [_cpu_s(pid) for pid in pids]
        started = time.monotonic()
        answers = asyncio.run(
            loadgen.open_loop((stack.gateway_url,), schedule, timeout_s=self.scale.request_timeout_s)
        )
        wall = max(1e-9, time.monotonic() - started)
        self.log.write(f"  {scenario.name} {tag}: {len(requests)} requests in {wall:.0f}s\n")
        cpu = [(_cpu_s(pid) - before) / wall for pid, before in zip(pids, cpu_before, strict=True)]
        waits = self._queue_waits(prefix, len(requests))
        bad = fill(requests, answers, waits, prefix)
        result = RunResult(
            policy=self.policy,
            replicas=self.scale.pods,
            requests=tuple(requests),
            pods={},
            end_s=wall,
            arrivals_end_s=requests[-1].arrival_s if requests else 0.0,
            steps=0,
            scrapes=0,
        )
        return result, LiveCosts(epp_cpu=cpu[0], envoy_cpu=cpu[1], bad_refusals=tuple(bad))

    def _queue_waits(self, prefix: str, count: int) -> dict[str, float]:
        """request id -> seconds it waited in the EPP's flow control, for this run's requests."""
        url = f"http://127.0.0.1:{self.stack.epp_metrics_port}/debug/decisions?limit={2 * count + 100}"
        try:
            decisions = json.loads(_get(url, timeout_s=30.0))["decisions"]
        except (OSError, ValueError, KeyError):
            return {}
        return {
            str(d["request_id"]): float(d["queue_wait_s"])
            for d in decisions
            if str(d.get("request_id", "")).startswith(prefix) and d.get("queue_wait_s") is not None
        }


def fill(
    requests: Sequence[SimRequest], answers: Sequence[loadgen.Answer], waits: dict[str, float], prefix: str
) -> list[str]:
    """Write each client's timings into its `SimRequest` as the simulator would have; returns
    the refusals whose body was wrong."""
    bad = []
    for request, answer in zip(requests, answers, strict=True):
        arrival = request.arrival_s
        if answer.status in REFUSALS:
            request.rejected = True
            request.refused_status = answer.status
            request.refused_s = arrival + answer.e2e_s
            problem = check_refusal(answer)
            if problem is not None:
                bad.append(problem)
            continue
        if not answer.served:
            continue  # no first token: counts as never served (∞), as an unfinished simulated request
        request.pod = "live"
        request.dispatched_s = arrival + waits.get(f"{prefix}-{request.index}", 0.0)
        request.first_token_s = arrival + answer.ttft_s
        if answer.whole:
            request.finish_s = arrival + answer.e2e_s
    return bad


# -- tables -----------------------------------------------------------------------------------------


def _s(value: float) -> str:
    if math.isnan(value):
        return "-"
    if math.isinf(value):
        return "∞"
    return f"{value * 1000:.0f}ms" if value < 1 else f"{value:.2f}s"


def _share(value: float) -> str:
    return f"{value:.1%}"


def _ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}x"


def _cpu(costs: LiveCosts) -> str:
    if math.isnan(costs.epp_cpu):
        return "-"
    return f"{costs.epp_cpu:.0%} / {costs.envoy_cpu:.0%}"


FLOOD_HEADER = [
    "policy", "run", "reqs", "done/s", "P99 TTFT", "goodput", "steady P99", "no flood", "flood/no-flood",
    "flooding P99", "jain", "429s", "503s", "refusal P50/P99", "queue P50/P99", "errors", "cpu EPP/Envoy",
]  # fmt: skip


def flood_cells(row: Row) -> list[str]:
    s, x = row.summary, row.extras
    return [
        row.policy,
        row.run,
        str(s.requests),
        f"{x.done_rps:.1f}",
        _s(s.ttft_p99_s),
        _share(s.slo_goodput),
        _s(s.steady_ttft_p99_s),
        _s(s.steady_ttft_p99_no_flood_s),
        _ratio(s.steady_flood_ratio),
        _s(s.flooding_ttft_p99_s),
        "-" if s.jain_fairness is None else f"{s.jain_fairness:.3f}",
        str(s.refused_429),
        str(s.refused_503),
        f"{_s(x.refusal_p50_s)} / {_s(x.refusal_p99_s)}",
        f"{_s(s.queue_wait_p50_s)} / {_s(s.queue_wait_p99_s)}",
        str(x.errors),
        _cpu(x.live),
    ]


def mix_header(scenario: Scenario) -> list[str]:
    classes = sorted(scenario.workload.priorities, key=lambda c: -c.priority)
    lowest = classes[-1].objective if classes else "lowest"
    return [
        "policy", "run", "reqs", "done/s", "P99 TTFT", "goodput",
        *(f"{c.objective} ({c.priority}) P99 / goodput / refused" for c in classes),
        f"{lowest} refusal P99", "429s", "503s", "queue P50/P99", "errors", "cpu EPP/Envoy",
    ]  # fmt: skip


def mix_cells(row: Row) -> list[str]:
    s, x = row.summary, row.extras
    return [
        row.policy,
        row.run,
        str(s.requests),
        f"{x.done_rps:.1f}",
        _s(s.ttft_p99_s),
        _share(s.slo_goodput),
        *(f"{_s(p.ttft_p99_s)} / {_share(p.slo_goodput)} / {p.refused}" for p in s.by_priority),
        _s(x.lowest_refusal_p99_s),
        str(s.refused_429),
        str(s.refused_503),
        f"{_s(s.queue_wait_p50_s)} / {_s(s.queue_wait_p99_s)}",
        str(x.errors),
        _cpu(x.live),
    ]


def markdown(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cells) + " |" for cells in rows]
    return "\n".join(lines)


# -- do live and simulated agree on the order of policies? ----------------------------------------


Tie = Callable[[float, float], bool]  # whether two values of a figure are within its noise


def points(within: float) -> Tie:
    """Shares within `within` of each other (absolute) are a tie."""
    return lambda a, b: abs(a - b) <= within


def relative(within: float) -> Tie:
    """Latencies within `within` of the larger (relative) are a tie; two infinities too."""
    return lambda a, b: a == b or (max(a, b) < math.inf and abs(a - b) <= within * max(a, b))


# The runs are short (≈ 170-200 measured requests, a P99 is the second-worst): differences
# smaller than these are within what two runs of the same code on this machine differ by.
GOODPUT_TIE = points(0.05)
P99_TIE = relative(0.2)


def _value(value: float) -> float:
    return math.inf if math.isnan(value) else value


def discordant(live: dict[str, float], sim: dict[str, float], tie: Tie) -> list[tuple[str, str]]:
    """Pairs of policies that live and simulated order the opposite ways, neither a tie."""
    names = [n for n in live if n in sim]
    pairs = []
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            la, lb, sa, sb = (_value(v) for v in (live[a], live[b], sim[a], sim[b]))
            if tie(la, lb) or tie(sa, sb):
                continue
            if (la > lb) != (sa > sb):
                pairs.append((a, b))
    return pairs


def order_line(
    what: str, key: Callable[[Row], float], rows: Sequence[Row], *, higher_better: bool, tie: Tie
) -> str:
    """`what`, best first, in each run kind, and whether each simulated order agrees with live's
    (pairs within `tie` agree with any order)."""
    by_run: dict[str, dict[str, float]] = {}
    for row in rows:
        by_run.setdefault(row.run, {})[row.policy] = key(row)
    sign = -1.0 if higher_better else 1.0
    parts = []
    for run, values in by_run.items():
        order = " > ".join(sorted(values, key=lambda p: sign * _value(values[p])))
        if run != "live" and "live" in by_run:
            pairs = ", ".join(f"{a} vs {b}" for a, b in discordant(by_run["live"], values, tie))
            order += ": " + (f"disagrees on {pairs}" if pairs else "agrees")
        parts.append(f"{run} {order}")
    return f"- {what}, best first: " + "; ".join(parts)


def report(scenario: Scenario, rows: Sequence[Row]) -> str:
    """One scenario's markdown: its table, and whether live and simulated order the policies alike."""
    if scenario.workload.flood is not None:
        table = markdown(FLOOD_HEADER, [flood_cells(r) for r in rows])
        headline = order_line(
            "steady tenants' P99 TTFT",
            lambda r: r.summary.steady_ttft_p99_s,
            rows,
            higher_better=False,
            tie=P99_TIE,
        )
    else:
        table = markdown(mix_header(scenario), [mix_cells(r) for r in rows])
        top = max(scenario.workload.priorities, key=lambda c: c.priority)
        headline = order_line(
            f"{top.objective} goodput",
            lambda r: next(p.slo_goodput for p in r.summary.by_priority if p.objective == top.objective),
            rows,
            higher_better=True,
            tie=GOODPUT_TIE,
        )
    goodput = order_line(
        "goodput", lambda r: r.summary.slo_goodput, rows, higher_better=True, tie=GOODPUT_TIE
    )
    return "\n".join([f"### {scenario.name}", "", table, "", goodput, headline, ""])


def describe(flood: Scenario, mix: Scenario, scale: Scale) -> str:
    """The scaled fleet and workloads in a paragraph, and what the cells mean."""
    spec = flood.workload
    assert spec.flood is not None
    pods = (
        f"{scale.pods} `epp sim` pods (--max-num-seqs {scale.max_num_seqs}, --max-loras {scale.max_loras}, "
        f"--time-to-first-token {scale.time_to_first_token_s * 1000:g}ms, "
        f"--inter-token-latency {scale.inter_token_latency_s * 1000:g}ms), "
        f"outputs {scale.output_tokens[0]}-{scale.output_tokens[1]} tokens"
    )
    load = f"capacity {scale.capacity_rps:g} req/s; SLO TTFT ≤ {scale.slo_ttft_s:g}s"
    flooding = (
        f"{flood.name}: {spec.rate_rps:g} req/s, {spec.flood_adapter} ×{spec.flood.factor:g} "
        f"from {spec.flood.at_s:g}s for {spec.flood.duration_s:g}s, {spec.duration_s:g}s "
        f"(first {flood.warmup_s:g}s not measured)"
    )
    mixing = (
        f"{mix.name}: {mix.workload.rate_rps:g} req/s, {mix.workload.duration_s:g}s "
        f"(first {mix.warmup_s:g}s not measured)"
    )
    return (
        f"{pods}; {load}. {flooding}. {mixing}. Seed {flood.seed}.\n\n"
        "Cells: done/s: requests finished per second of the measured arrival window (below the offered "
        "rate while the pods are saturated); "
        "TTFT over served requests (a request not answered counts ∞); goodput: measured requests "
        "(refused ones included) with TTFT within the SLO; refusal: arrival to the 429/503; queue: wait in "
        "the EPP's flow control (live: its decision log); errors: neither served nor refused; cpu: EPP and "
        "Envoy CPU per wall second during the live run. Orders: a pair of policies whose goodputs are "
        "within 5 points, or P99s within 20 %, in either run counts as a tie (agrees with any order).\n"
    )


# -- the whole run ----------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class Outcome:
    flood: Scenario
    mix: Scenario
    rows: dict[str, list[Row]]  # scenario name -> rows, live then sim per policy
    probe: Probe | None  # None without live runs
    seconds: float
    load: tuple[float, float]  # the machine's 1-minute load average at the start and at the end

    def bad_refusals(self) -> list[str]:
        return [b for rows in self.rows.values() for r in rows for b in r.extras.live.bad_refusals]

    def markdown(self, scale: Scale) -> str:
        start, end = self.load
        machine = (
            f"Wall time {self.seconds:.0f}s on {os.cpu_count()} cores, 1-minute load average "
            f"{start:.1f} at the start and {end:.1f} at the end.\n"
        )
        if self.probe is not None:
            machine += self.probe.line() + "\n"
        parts = [describe(self.flood, self.mix, scale), machine]
        parts += [report(s, self.rows[s.name]) for s in (self.flood, self.mix)]
        return "\n".join(parts)


PROBED = "sim (probed)"  # the simulator with the pods' costs scaled to the probe's step time


def run(
    policies: Sequence[str],
    *,
    scale: Scale = Scale(),
    seed: int = 1,
    live: bool = True,
    log: TextIO = sys.stderr,
) -> Outcome:
    """Every policy on both scaled scenarios, live (unless `live` is False) and simulated: with the
    sims' flags (`sim`), and with their costs slowed as the probe found the live pods (`PROBED`),
    which tells a routing difference from a machine too busy to keep the sims' pace."""
    started, load = time.monotonic(), os.getloadavg()[0]
    flood, mix = scaled(FLOOD, scale, seed), scaled(MIX, scale, seed)
    rows: dict[str, list[Row]] = {FLOOD: [], MIX: []}
    lives: dict[tuple[str, str], Row] = {}
    probe: Probe | None = None
    if live:
        adapters = tuple(sorted({*flood.workload.adapters, *mix.workload.adapters}))
        with LiveFleet(scale, adapters, objectives_yaml(mix, POOL_NAME), seed=seed, log=log) as fleet:
            for policy in policies:
                log.write(f"[{time.monotonic() - started:5.0f}s] live {policy}\n")
                fleet.serve(policy)
                probe = probe or fleet.probe()
                for scenario in (flood, mix):
                    lives[(scenario.name, policy)] = figures(scenario, policy, fleet.run, "live")
    slowed: tuple[Scenario, ...] = ()
    if probe is not None and math.isfinite(probe.step_s):
        factor = probe.step_s / probe.set_step_s
        probed = dataclasses.replace(
            scale,
            time_to_first_token_s=scale.time_to_first_token_s * factor,
            inter_token_latency_s=scale.inter_token_latency_s * factor,
        )
        slowed = (scaled(FLOOD, probed, seed), scaled(MIX, probed, seed))
    for policy in policies:
        for scenario in (flood, mix):
            if (scenario.name, policy) in lives:
                rows[scenario.name].append(lives[(scenario.name, policy)])
            rows[scenario.name].append(simulated(scenario, policy))
        for scenario in slowed:
            rows[scenario.name].append(simulated(scenario, policy, PROBED))
    seconds = time.monotonic() - started
    return Outcome(flood, mix, rows, probe, seconds, (load, os.getloadavg()[0]))


def _finite(value: object) -> object:
    """JSON has no NaN or infinity: None for either."""
    return None if isinstance(value, float) and not math.isfinite(value) else value


def _flat(extras: Extras) -> dict[str, object]:
    fields = {f.name: getattr(extras, f.name) for f in dataclasses.fields(extras) if f.name != "live"}
    return fields | dataclasses.asdict(extras.live)


def results_json(outcome: Outcome) -> dict[str, object]:
    probe = (
        None
        if outcome.probe is None
        else {k: _finite(v) for k, v in dataclasses.asdict(outcome.probe).items()}
    )
    return {"probe": probe} | {
        name: [
            {
                "policy": r.policy,
                "run": r.run,
                **r.summary.as_json(),
                **{k: _finite(v) for k, v in _flat(r.extras).items()},
            }
            for r in rows
        ]
        for name, rows in outcome.rows.items()
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument(
        "--out", type=pathlib.Path, default=None, help="write report.md and results.json here"
    )
    parser.add_argument("--policies", default=",".join(POLICIES), help="comma-separated `epp serve` policies")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--sim-only", action="store_true", help="only the simulated side (seconds)")
    args = parser.parse_args(argv)
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    scale = Scale()
    try:
        outcome = run(policies, scale=scale, seed=args.seed, live=not args.sim_only)
    except StackError as exc:
        print(f"the live stack failed: {exc}", file=sys.stderr)
        return 1
    text = outcome.markdown(scale)
    print(text)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "report.md").write_text(text, encoding="utf-8")
        (args.out / "results.json").write_text(json.dumps(results_json(outcome), indent=2), encoding="utf-8")
    bad = outcome.bad_refusals()
    for problem in bad[:10]:
        print(f"refusal without a JSON error body: {problem}", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
