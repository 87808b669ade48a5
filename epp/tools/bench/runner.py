"""One benchmark: every policy on one scenario, the figures per policy, and the replica search.

Figures are taken over requests that arrived after the scenario's warm-up; a request that
never got a first token counts as missing the SLO and as an infinite latency in percentiles.

Flow-control figures (every scenario; requests queue in the EPP under `default` only):

- EPP queue wait: dispatched − arrival for a request sent to a pod (0 when it never queued), 0
  for one refused on arrival (429), the queue's TTL for one answered 503 when its TTL ran out,
  infinite for one still queued when the run stopped. P50/P99 over every measured request.
- 429s and 503s: measured requests the EPP refused with that status (both count as `rejected`).
- Per priority (scenarios with `priorities:`), for each objective: P99 TTFT over its served
  requests and its goodput (the share of its measured requests, refused ones included, whose TTFT
  met the SLO).
- Per tenant (scenarios with `tenants:`): each tenant's goodput as above, and Jain's fairness
  index over tenants' goodputs: J = (Σ xᵢ)² / (n · Σ xᵢ²) for the n tenants with measured
  requests; 1 when every tenant fares alike, 1/n when one gets everything (1 when all are 0).
- Flood (scenarios with `flood:`): P99 TTFT of the steady tenants (every request not for the
  flooding adapter) and of the flooding tenant (its requests, normal and extra), and the steady
  tenants' P99 TTFT in a run of the same scenario without the flood (same seed, same steady
  requests), and their ratio.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from epp.picker.datastore.types import InferenceModel, InferenceObjective, TargetModel
from epp.tools.bench import floors, workload
from epp.tools.bench.events import NAMESPACE, POOL_NAME, Fleet, RunResult, simulate
from epp.tools.bench.model import SimRequest
from epp.tools.bench.scenario import Scenario

# (policy, what, fraction done of that part) for a progress bar
ProgressSink = Callable[[str, str, float], None]


@dataclass(frozen=True, slots=True)
class PriorityFigures:
    """One objective's requests under one policy."""

    objective: str
    priority: int
    requests: int  # measured
    ttft_p99_s: float  # over its served requests
    slo_goodput: float  # its measured requests that met the SLO
    refused: int  # 429s and 503s


@dataclass(frozen=True, slots=True)
class TenantFigures:
    """One tenant's (fairness ID's) requests under one policy."""

    tenant: str
    requests: int
    ttft_p99_s: float
    slo_goodput: float
    refused: int


@dataclass(frozen=True, slots=True)
class PolicySummary:
    policy: str
    requests: int  # measured requests (arrived after warm-up)
    rejected: int
    unfinished: int
    swaps: int
    swaps_per_1k: float
    adapter_hit_rate: float
    slot_wait_rate: float  # arrived while every GPU slot of its pod held other in-flight adapters
    prefix_hit_rate: float
    ttft_p50_s: float
    ttft_p99_s: float
    e2e_p50_s: float
    e2e_p99_s: float
    throughput_rps: float  # measured requests finished per second of the measured window
    slo_goodput: float
    replicas_for_slo: int | None = None  # None: not searched or not met within the search bound
    swaps_floor_per_1k: float = 0.0  # the floor over the requests this policy got into a batch
    swaps_vs_floor: float | None = None  # swaps_per_1k ÷ swaps_floor_per_1k; None when the floor is 0
    ttft_floor_p50_s: float = math.nan  # the same policy with unlimited slots and free adapter loads
    ttft_floor_p99_s: float = math.nan
    queue_wait_p50_s: float = 0.0  # in the EPP's flow-control queues (see the module docstring)
    queue_wait_p99_s: float = 0.0
    refused_429: int = 0
    refused_503: int = 0
    by_priority: tuple[PriorityFigures, ...] = ()  # per objective, highest priority first
    by_tenant: tuple[TenantFigures, ...] = ()  # per tenant, by name
    jain_fairness: float | None = None  # over tenants' goodput; None without tenants
    steady_ttft_p99_s: float = math.nan  # flood: every request not for the flooding adapter
    flooding_ttft_p99_s: float = math.nan  # flood: the flooding adapter's requests
    steady_ttft_p99_no_flood_s: float = math.nan  # flood: the steady ones in the run without it
    ttft_samples_s: tuple[float, ...] = field(default=(), repr=False)  # sorted, for CDF plots
    e2e_samples_s: tuple[float, ...] = field(default=(), repr=False)
    swap_times_s: tuple[float, ...] = field(default=(), repr=False)  # arrivals that swapped, in order

    @property
    def steady_flood_ratio(self) -> float | None:
        """Steady tenants' P99 TTFT with the flood ÷ without it; None when either is not finite."""
        flood, calm = self.steady_ttft_p99_s, self.steady_ttft_p99_no_flood_s
        if not (math.isfinite(flood) and math.isfinite(calm)) or calm <= 0:
            return None
        return flood / calm

    def as_json(self) -> dict[str, object]:
        data = dataclasses.asdict(self)
        del data["ttft_samples_s"], data["e2e_samples_s"], data["swap_times_s"], data["policy"]
        data["steady_flood_ratio"] = self.steady_flood_ratio
        return {k: _json_value(v) for k, v in data.items()}


def _json_value(value: object) -> object:
    """Non-finite floats as None, inside lists and mappings too (JSON has no inf or NaN)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, list | tuple):
        return [_json_value(v) for v in value]
    if isinstance(value, dict):
        return {k: _json_value(v) for k, v in value.items()}
    return value


def _percentile(sorted_values: Sequence[float], q: float) -> float:
    if not sorted_values:
        return math.nan
    rank = q / 100 * (len(sorted_values) - 1)
    low = math.floor(rank)
    high = min(low + 1, len(sorted_values) - 1)
    a, b = sorted_values[low], sorted_values[high]
    if math.isinf(a) or math.isinf(b):
        return math.inf if rank - low > 0 or math.isinf(a) else a
    return a + (b - a) * (rank - low)


def jain_index(values: Sequence[float]) -> float:
    """Jain's fairness index (Σ x)² / (n · Σ x²): 1 when all are equal, 1/n when one has it all.

    Empty or all-zero inputs are equal shares: 1.
    """
    squares = sum(v * v for v in values)
    if not values or squares == 0:
        return 1.0
    return sum(values) ** 2 / (len(values) * squares)


def queue_wait_s(request: SimRequest) -> float:
    """How long `request` waited in the EPP's queues (see the module docstring)."""
    if request.dispatched_s is not None:
        return max(0.0, request.dispatched_s - request.arrival_s)
    if request.refused_s is not None:
        return max(0.0, request.refused_s - request.arrival_s)  # refused on arrival, or from its queue
    return math.inf  # still waiting when the run stopped


def _ttft(request: SimRequest) -> float:
    return request.ttft_s if request.ttft_s is not None else math.inf


def _group_figures(group: Sequence[SimRequest], slo_ttft_s: float) -> tuple[float, float, int]:
    """(P99 TTFT over the served, goodput over all, refused) of a group of measured requests."""
    served = sorted(_ttft(r) for r in group if not r.rejected)
    met = sum(1 for t in served if t <= slo_ttft_s)
    return _percentile(served, 99), (met / len(group) if group else 0.0), len(group) - len(served)


def summarize(
    result: RunResult,
    *,
    warmup_s: float,
    slo_ttft_s: float,
    priorities: Sequence[workload.PriorityClass] = (),
    flooding: frozenset[int] | None = None,
) -> PolicySummary:
    """The figures of one run. `priorities`: the scenario's objectives (per-priority figures);
    `flooding`: the indices of the flooding adapter's requests (flood figures)."""
    measured = [r for r in result.requests if r.arrival_s >= warmup_s]
    served = [r for r in measured if not r.rejected]
    with_adapter = [r for r in served if r.adapter]
    ttfts = sorted(r.ttft_s if r.ttft_s is not None else math.inf for r in served)
    e2es = sorted(r.e2e_s if r.e2e_s is not None else math.inf for r in served)
    prompt_tokens = sum(r.prompt_tokens for r in served)
    cached = sum(r.cached_tokens for r in served)
    swaps = sum(1 for r in served if r.caused_swap)
    finished = [r for r in served if r.finish_s is not None]
    window_s = max(1e-9, result.arrivals_end_s - warmup_s)
    n = len(measured)
    waits = sorted(queue_wait_s(r) for r in measured)
    by_priority = []
    for c in sorted(priorities, key=lambda c: -c.priority):
        group = [r for r in measured if r.objective == c.objective]
        p99, goodput, refused = _group_figures(group, slo_ttft_s)
        by_priority.append(PriorityFigures(c.objective, c.priority, len(group), p99, goodput, refused))
    tenants: dict[str, list[SimRequest]] = {}
    for r in measured:
        if r.tenant:
            tenants.setdefault(r.tenant, []).append(r)
    by_tenant = []
    for name in sorted(tenants):
        p99, goodput, refused = _group_figures(tenants[name], slo_ttft_s)
        by_tenant.append(TenantFigures(name, len(tenants[name]), p99, goodput, refused))
    steady_p99 = flooding_p99 = math.nan
    if flooding is not None:
        steady_p99 = _group_figures([r for r in measured if r.index not in flooding], slo_ttft_s)[0]
        flooding_p99 = _group_figures([r for r in measured if r.index in flooding], slo_ttft_s)[0]
    return PolicySummary(
        policy=result.policy,
        requests=n,
        rejected=n - len(served),
        unfinished=len(served) - len(finished),
        swaps=swaps,
        swaps_per_1k=1000.0 * swaps / n if n else 0.0,
        adapter_hit_rate=sum(r.adapter_hit for r in with_adapter) / len(with_adapter)
        if with_adapter
        else 1.0,
        slot_wait_rate=(
            sum(r.slot_blocked for r in with_adapter) / len(with_adapter) if with_adapter else 0.0
        ),
        prefix_hit_rate=cached / prompt_tokens if prompt_tokens else 0.0,
        ttft_p50_s=_percentile(ttfts, 50),
        ttft_p99_s=_percentile(ttfts, 99),
        e2e_p50_s=_percentile(e2es, 50),
        e2e_p99_s=_percentile(e2es, 99),
        throughput_rps=len(finished) / window_s,
        slo_goodput=sum(1 for t in ttfts if t <= slo_ttft_s) / n if n else 0.0,
        queue_wait_p50_s=_percentile(waits, 50) if waits else 0.0,
        queue_wait_p99_s=_percentile(waits, 99) if waits else 0.0,
        refused_429=sum(1 for r in measured if r.refused_status == 429),
        refused_503=sum(1 for r in measured if r.refused_status == 503),
        by_priority=tuple(by_priority),
        by_tenant=tuple(by_tenant),
        jain_fairness=jain_index([t.slo_goodput for t in by_tenant]) if by_tenant else None,
        steady_ttft_p99_s=steady_p99,
        flooding_ttft_p99_s=flooding_p99,
        ttft_samples_s=tuple(ttfts),
        e2e_samples_s=tuple(e2es),
        swap_times_s=tuple(sorted(r.arrival_s for r in served if r.caused_swap)),
    )


def fleet_for(scenario: Scenario, replicas: int | None = None) -> Fleet:
    return Fleet(
        profile=scenario.profile,
        config=scenario.pod_config,
        replicas=scenario.replicas if replicas is None else replicas,
        scrape_interval_s=scenario.scrape_interval_s,
        models=inference_models(scenario),
        epp_replicas=scenario.epp_replicas,
        epp_peers=scenario.epp_peers,
        epp_latency_s=scenario.epp_latency_s,
        objectives=inference_objectives(scenario),
    )


def inference_objectives(scenario: Scenario) -> tuple[InferenceObjective, ...]:
    """The scenario's priority mix as the pool's InferenceObjectives."""
    return tuple(
        InferenceObjective(name=c.objective, namespace=NAMESPACE, pool_name=POOL_NAME, priority=c.priority)
        for c in scenario.workload.priorities
    )


def adapter_indices(scenario: Scenario, adapter: str) -> frozenset[int]:
    """The indices of the scenario's requests for `adapter`, as generated (before a split rewrote
    their model)."""
    return frozenset(
        r.index for r in workload.generate(scenario.workload, scenario.seed) if r.adapter == adapter
    )


def without_flood(scenario: Scenario) -> Scenario:
    """The same scenario with no flood: the same steady requests, the flooding adapter at its normal rate."""
    return dataclasses.replace(scenario, workload=dataclasses.replace(scenario.workload, flood=None))


def summarize_scenario(
    scenario: Scenario, result: RunResult, *, flood_adapter: str | None = None
) -> PolicySummary:
    """`summarize` with the scenario's warm-up, SLO, objectives and flood (`flood_adapter`: whose
    requests are the flooding tenant's; default: the scenario's flood's)."""
    name = flood_adapter if flood_adapter is not None else scenario.workload.flood_adapter
    return summarize(
        result,
        warmup_s=scenario.warmup_s,
        slo_ttft_s=scenario.slo.ttft_s,
        priorities=scenario.workload.priorities,
        flooding=None if name is None else adapter_indices(scenario, name),
    )


def inference_models(scenario: Scenario) -> tuple[InferenceModel, ...]:
    """The scenario's splits as InferenceModels, plus one per other client model name.

    With any InferenceModel in the pool the Director answers 404 for a model none declares, as
    `epp serve` does, so a scenario with splits declares every name its clients send.
    """
    if not scenario.splits:
        return ()
    split = dict(scenario.splits)
    names = (*scenario.workload.adapters, scenario.pod_config.served_model_name)
    return tuple(
        InferenceModel(
            name=name,
            namespace=NAMESPACE,
            model_name=name,
            pool_name=POOL_NAME,
            target_models=tuple(TargetModel(target, weight) for target, weight in split.get(name, ())),
        )
        for name in names
    )


def run_policy(
    scenario: Scenario,
    policy: str,
    *,
    replicas: int | None = None,
    requests: list[SimRequest] | None = None,
    progress: Callable[[float], None] | None = None,
) -> RunResult:
    reqs = requests if requests is not None else workload.generate(scenario.workload, scenario.seed)
    return simulate(policy, fleet_for(scenario, replicas), reqs, seed=scenario.seed, progress=progress)


def meets_slo(
    scenario: Scenario, policy: str, replicas: int, requests: list[SimRequest] | None = None
) -> bool:
    summary = summarize(
        run_policy(scenario, policy, replicas=replicas, requests=requests),
        warmup_s=scenario.warmup_s,
        slo_ttft_s=scenario.slo.ttft_s,
    )
    return summary.slo_goodput >= scenario.slo.target_goodput


def fewest_replicas(
    scenario: Scenario, policy: str, *, requests_factory: Callable[[], list[SimRequest]] | None = None
) -> int | None:
    """Binary search for the fewest replicas meeting the SLO (more replicas never hurt here)."""

    def ok(n: int) -> bool:
        return meets_slo(scenario, policy, n, requests_factory() if requests_factory else None)

    low, high = 1, scenario.slo.max_replicas
    if not ok(high):
        return None
    while low < high:
        mid = (low + high) // 2
        if ok(mid):
            high = mid
        else:
            low = mid + 1
    return low


def dedicated_replicas(scenario: Scenario, *, policy: str = "round-robin") -> dict[str, int | None]:
    """One deployment per adapter (no sharing): the fewest replicas each needs for the SLO.

    Each deployment serves only its adapter's share of the same request stream, behind a plain
    Service (round-robin), with one LoRA slot in use.
    """
    all_requests = workload.generate(scenario.workload, scenario.seed)
    needs: dict[str, int | None] = {}
    for adapter in sorted({r.adapter for r in all_requests}):

        def subset(adapter: str = adapter) -> list[SimRequest]:
            fresh = workload.generate(scenario.workload, scenario.seed)
            return [r for r in fresh if r.adapter == adapter]

        needs[adapter or "base"] = fewest_replicas(scenario, policy, requests_factory=subset)
    return needs


@dataclass(frozen=True, slots=True)
class BenchResult:
    scenario: Scenario
    summaries: dict[str, PolicySummary]
    dedicated: dict[str, int | None] | None = None  # per-adapter replicas, for `deployment: dedicated`
    swaps_floor_per_1k: float = 0.0  # what no router could beat on this request list (see floors)
    floor_swap_times_s: tuple[float, ...] = field(default=(), repr=False)  # when that floor swaps

    @property
    def dedicated_total(self) -> int | None:
        if self.dedicated is None or any(v is None for v in self.dedicated.values()):
            return None
        return sum(v for v in self.dedicated.values() if v is not None)


def run_bench(
    scenario: Scenario,
    policies: Sequence[str],
    *,
    search_replicas: bool = True,
    progress: ProgressSink | None = None,
    search_scenario: Scenario | None = None,
) -> BenchResult:
    """Run every policy on `scenario`; the replica search runs on `search_scenario` (default: same)."""
    searched = search_scenario if search_scenario is not None else scenario
    summaries: dict[str, PolicySummary] = {}
    floor_per_1k: float | None = None
    floor_times: tuple[float, ...] = ()
    for policy in policies:

        def tick(fraction: float, policy: str = policy) -> None:
            if progress is not None:
                progress(policy, "run", fraction)

        run = run_policy(scenario, policy, progress=tick)
        if floor_per_1k is None:
            floor_times = floor_swap_times(scenario, run.requests)
            floor_per_1k = per_1k_measured(scenario, run.requests, len(floor_times))
        summary = with_floors(
            summarize_scenario(scenario, run),
            swaps_floor_per_1k(scenario, run.requests, served_only=True),
            summarize(
                run_policy(unconstrained(scenario), policy),
                warmup_s=scenario.warmup_s,
                slo_ttft_s=scenario.slo.ttft_s,
            ),
        )
        flood_adapter = scenario.workload.flood_adapter
        if flood_adapter is not None:
            if progress is not None:
                progress(policy, "no-flood run", 0.0)
            calm = without_flood(scenario)
            calm_summary = summarize_scenario(calm, run_policy(calm, policy), flood_adapter=flood_adapter)
            summary = dataclasses.replace(summary, steady_ttft_p99_no_flood_s=calm_summary.steady_ttft_p99_s)
            if progress is not None:
                progress(policy, "no-flood run", 1.0)
        if search_replicas:
            if progress is not None:
                progress(policy, "replica search", 0.0)
            summary = dataclasses.replace(summary, replicas_for_slo=fewest_replicas(searched, policy))
            if progress is not None:
                progress(policy, "replica search", 1.0)
        summaries[policy] = summary
    dedicated = None
    if scenario.deployment == "dedicated" and search_replicas:
        if progress is not None:
            progress("dedicated", "replica search", 0.0)
        dedicated = dedicated_replicas(searched)
        if progress is not None:
            progress("dedicated", "replica search", 1.0)
    return BenchResult(
        scenario=scenario,
        summaries=summaries,
        dedicated=dedicated,
        swaps_floor_per_1k=floor_per_1k or 0.0,
        floor_swap_times_s=floor_times,
    )


def swaps_floor_per_1k(
    scenario: Scenario, requests: Sequence[SimRequest], *, served_only: bool = False
) -> float:
    """The Belady floor over the run's requests (targets as resolved), per 1,000 measured requests.

    `served_only` leaves out requests that never got into a batch (shed, or still waiting when
    the run stopped): they loaded nothing, so an overloaded policy is read against the floor of
    what it did serve. The denominator stays every measured request, as for the policy's swaps.
    """
    return per_1k_measured(
        scenario, requests, len(floor_swap_times(scenario, requests, served_only=served_only))
    )


def per_1k_measured(scenario: Scenario, requests: Sequence[SimRequest], count: int) -> float:
    """`count` per 1,000 requests that arrived after the warm-up."""
    measured = sum(1 for r in requests if r.arrival_s >= scenario.warmup_s)
    return 1000.0 * count / measured if measured else 0.0


def floor_swap_times(
    scenario: Scenario, requests: Sequence[SimRequest], *, served_only: bool = False
) -> tuple[float, ...]:
    """When the Belady floor swaps: the arrival time of each measured request at which it evicts."""
    ordered = sorted(requests, key=lambda r: r.index)
    adapters = [r.adapter if not served_only or (r.pod and not r.queued) else "" for r in ordered]
    slots = scenario.replicas * scenario.pod_config.max_loras
    return tuple(
        ordered[index].arrival_s
        for index in floors.belady_evictions(adapters, slots)
        if ordered[index].arrival_s >= scenario.warmup_s
    )


def unconstrained(scenario: Scenario) -> Scenario:
    """The same fleet with no LoRA constraint: a slot for every adapter, free loads, no batch penalty."""
    adapters = len(scenario.workload.adapters) + sum(len(targets) for _, targets in scenario.splits) + 1
    return dataclasses.replace(
        scenario,
        profile=dataclasses.replace(scenario.profile, adapter_load_s=0.0, lora_step_overhead_per_adapter=0.0),
        pod_config=dataclasses.replace(scenario.pod_config, max_loras=adapters, max_cpu_loras=adapters),
    )


def with_floors(summary: PolicySummary, floor_per_1k: float, free: PolicySummary) -> PolicySummary:
    """`summary` with its swaps read against the floor and the TTFT of the unconstrained run."""
    return dataclasses.replace(
        summary,
        swaps_floor_per_1k=floor_per_1k,
        swaps_vs_floor=summary.swaps_per_1k / floor_per_1k if floor_per_1k > 0 else None,
        ttft_floor_p50_s=free.ttft_p50_s,
        ttft_floor_p99_s=free.ttft_p99_s,
    )


def cdf_points(samples: Sequence[float], points: int = 200) -> tuple[np.ndarray, np.ndarray]:
    """Finite samples thinned to at most `points` (x, F(x)) pairs for plotting."""
    finite = np.array([s for s in samples if math.isfinite(s)])
    if finite.size == 0:
        return np.array([]), np.array([])
    idx = np.unique(np.linspace(0, finite.size - 1, min(points, finite.size)).astype(int))
    return finite[idx], (idx + 1) / len(samples)
