"""Workloads: adapter popularity (uniform, Zipf, tiers), Gamma arrivals and trace replay, and who
sends them: tenants (fairness IDs), a tenant's flood, a priority mix (InferenceObjectives).

Everything is drawn from generators seeded by the caller, so a seed fixes the whole request list.
The base stream (arrivals, lengths, adapters) comes from one generator; each addition (the
flood's extra arrivals, the tenants, the objectives) from its own, derived from the same seed. So
adding any of them leaves the base stream as it was: a scenario without them gives the same list
it always did, and a flood run and its no-flood twin share every steady request.
"""

from __future__ import annotations

import csv
import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import numpy as np

from epp.tools.bench.model import SimRequest

PACKAGED_TRACES = {"azure-conv": "azure-llm-inference-2023-conv.csv"}
TRACE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")


@dataclass(frozen=True, slots=True)
class TraceRow:
    offset_s: float  # seconds since the trace's first row
    context_tokens: int
    generated_tokens: int


def adapter_names(count: int) -> tuple[str, ...]:
    return tuple(f"adapter-{i:03d}" for i in range(count))


def zipf_weights(count: int, alpha: float) -> np.ndarray:
    """Power-law popularity: the i-th most popular adapter gets weight ∝ 1 / i^alpha (S-LoRA)."""
    ranks = np.arange(1, count + 1, dtype=float)
    weights = 1.0 / ranks**alpha
    return np.asarray(weights / weights.sum())


def tier_weights(tiers: Sequence[tuple[int, float]]) -> np.ndarray:
    """Per-adapter weights from (count, share each) tiers, e.g. GIE's 5×12 %, 5×6 %, 5×2 %."""
    weights = np.array([share for count, share in tiers for _ in range(count)], dtype=float)
    if weights.size == 0 or weights.sum() <= 0:
        raise ValueError("tiers must name at least one adapter with a positive share")
    return np.asarray(weights / weights.sum())


def gamma_arrivals(rng: np.random.Generator, rate_rps: float, cv: float, duration_s: float) -> np.ndarray:
    """Arrival times in [0, duration_s): Gamma inter-arrival gaps with mean 1/rate and the given cv.

    cv = 1 is a Poisson process; larger cv is burstier (S-LoRA's arrival model).
    """
    if rate_rps <= 0 or cv <= 0 or duration_s <= 0:
        raise ValueError("rate_rps, cv and duration_s must be positive")
    shape = 1.0 / (cv * cv)
    scale = 1.0 / (rate_rps * shape)
    expected = int(rate_rps * duration_s * 1.2) + 64
    times: list[float] = []
    t = 0.0
    while True:
        gaps = rng.gamma(shape, scale, size=expected)
        for gap in gaps:
            t += float(gap)
            if t >= duration_s:
                return np.array(times)
            times.append(t)


def _parse_timestamp(text: str) -> dt.datetime:
    # The Azure trace writes 7 fractional digits; datetime takes at most 6.
    head, _, frac = text.strip().partition(".")
    return dt.datetime.strptime(f"{head}.{(frac or '0')[:6]:0<6}", "%Y-%m-%d %H:%M:%S.%f")


def resolve_trace(name_or_path: str) -> Path:
    """A packaged trace name (`azure-conv`) or a file path."""
    if name_or_path in PACKAGED_TRACES:
        ref = resources.files("epp.tools.bench") / "data" / PACKAGED_TRACES[name_or_path]
        return Path(str(ref))
    path = Path(name_or_path)
    if not path.is_file():
        raise ValueError(f"trace {name_or_path!r} is neither a packaged trace nor a file")
    return path


def read_trace(path: Path) -> list[TraceRow]:
    """Rows of a CSV with columns TIMESTAMP, ContextTokens, GeneratedTokens, sorted by time."""
    with path.open(newline="", encoding="utf-8") as handle:
        reader = csv.DictReader(handle)
        missing = [c for c in TRACE_COLUMNS if c not in (reader.fieldnames or ())]
        if missing:
            raise ValueError(f"trace {path} lacks columns {', '.join(missing)}")
        raw: list[tuple[dt.datetime, int, int]] = []
        for line_no, row in enumerate(reader, start=2):
            try:
                raw.append(
                    (
                        _parse_timestamp(row["TIMESTAMP"]),
                        int(row["ContextTokens"]),
                        int(row["GeneratedTokens"]),
                    )
                )
            except (ValueError, TypeError) as exc:
                raise ValueError(f"trace {path} line {line_no}: {exc}") from exc
    if not raw:
        raise ValueError(f"trace {path} has no rows")
    raw.sort(key=lambda r: r[0])
    start = raw[0][0]
    return [TraceRow((t - start).total_seconds(), ctx, gen) for t, ctx, gen in raw]


@dataclass(frozen=True, slots=True)
class WorkloadSpec:
    """What to generate; the scenario file maps onto this one to one."""

    duration_s: float
    adapters: tuple[str, ...]
    popularity: np.ndarray  # one weight per adapter, sums to 1
    base_fraction: float = 0.0  # share of requests for the base model (no adapter)
    rate_rps: float = 10.0
    arrival_cv: float = 1.0
    prompt_tokens: tuple[int, int] = (8, 512)  # uniform, inclusive (S-LoRA's U[8, 512])
    output_tokens: tuple[int, int] = (8, 512)
    system_prompt_tokens: int = 0  # shared prefix per adapter, added to every prompt
    trace: tuple[TraceRow, ...] | None = None  # replaces arrivals and lengths
    trace_time_scale: float = 1.0  # > 1 replays the trace faster
    max_prompt_tokens: int = 16_384
    shift: PopularityShift | None = None  # the popular adapters change mid-run
    diurnal: DiurnalSwing | None = None  # the arrival rate swings around rate_rps
    tenants: Tenants | None = None  # who sends each request (its fairness ID); None: nobody says
    flood: Flood | None = None  # one adapter's requests arrive `factor` times as fast for a while
    priorities: tuple[PriorityClass, ...] = ()  # the objectives requests name, by share; (): none

    @property
    def flood_adapter(self) -> str | None:
        """The adapter whose requests flood, or None without a flood."""
        return None if self.flood is None else self.adapters[self.flood.adapter]


@dataclass(frozen=True, slots=True)
class Tenants:
    """How requests get a fairness ID: `by_adapter` (each adapter is its tenant, the base model
    "base"), or one of `count` tenants (`tenant-00` …) drawn uniformly per request."""

    by_adapter: bool = False
    count: int = 0

    def names(self) -> tuple[str, ...]:
        """The tenants a `count` draw picks from (empty for `by_adapter`)."""
        width = max(2, len(str(self.count - 1)))
        return tuple(f"tenant-{i:0{width}d}" for i in range(self.count))


BASE_TENANT = "base"  # the fairness ID of base-model requests when tenants are by adapter


@dataclass(frozen=True, slots=True)
class Flood:
    """From `at_s` for `duration_s`, adapter `adapter` (an index) gets `factor` × its normal rate:
    extra Poisson arrivals at (factor − 1) × that rate, merged into the stream."""

    adapter: int
    factor: float
    at_s: float
    duration_s: float

    @property
    def end_s(self) -> float:
        return self.at_s + self.duration_s


@dataclass(frozen=True, slots=True)
class PriorityClass:
    """An InferenceObjective and the share of requests that name it."""

    objective: str
    priority: int
    share: float


@dataclass(frozen=True, slots=True)
class PopularityShift:
    """From `at_s` on, adapter i takes the popularity adapter (i − rotate) had: new adapters get hot."""

    at_s: float
    rotate: int


@dataclass(frozen=True, slots=True)
class DiurnalSwing:
    """rate(t) = rate_rps · (1 + amplitude · sin(2πt / period_s)): a day's swing, compressed."""

    period_s: float
    amplitude: float

    def keep_probability(self, t: np.ndarray) -> np.ndarray:
        """Thinning: arrivals drawn at the peak rate are kept with rate(t) / peak rate."""
        return np.asarray(
            (1.0 + self.amplitude * np.sin(2 * np.pi * t / self.period_s)) / (1.0 + self.amplitude)
        )


# Streams of the additions, each its own generator derived from the seed (see the module docstring).
_FLOOD_STREAM = 1
_TENANT_STREAM = 2
_PRIORITY_STREAM = 3


def generate(spec: WorkloadSpec, seed: int) -> list[SimRequest]:
    """The request list, sorted by arrival; the same spec and seed give the same list."""
    requests = _base_requests(spec, seed)
    if spec.flood is not None:
        requests = _with_flood(spec, spec.flood, requests, np.random.default_rng([seed, _FLOOD_STREAM]))
    if spec.tenants is not None:
        _draw_tenants(spec.tenants, requests, np.random.default_rng([seed, _TENANT_STREAM]))
    if spec.priorities:
        _draw_objectives(spec.priorities, requests, np.random.default_rng([seed, _PRIORITY_STREAM]))
    return requests


def _base_requests(spec: WorkloadSpec, seed: int) -> list[SimRequest]:
    rng = np.random.default_rng(seed)
    if spec.trace is not None:
        rows = [r for r in spec.trace if r.offset_s / spec.trace_time_scale < spec.duration_s]
        arrivals = np.array([r.offset_s / spec.trace_time_scale for r in rows])
        prompts = np.array([r.context_tokens for r in rows])
        outputs = np.array([r.generated_tokens for r in rows])
    elif spec.diurnal is not None:
        peak = gamma_arrivals(
            rng, spec.rate_rps * (1 + spec.diurnal.amplitude), spec.arrival_cv, spec.duration_s
        )
        arrivals = peak[rng.random(peak.size) < spec.diurnal.keep_probability(peak)]
        prompts = rng.integers(spec.prompt_tokens[0], spec.prompt_tokens[1] + 1, size=arrivals.size)
        outputs = rng.integers(spec.output_tokens[0], spec.output_tokens[1] + 1, size=arrivals.size)
    else:
        arrivals = gamma_arrivals(rng, spec.rate_rps, spec.arrival_cv, spec.duration_s)
        prompts = rng.integers(spec.prompt_tokens[0], spec.prompt_tokens[1] + 1, size=arrivals.size)
        outputs = rng.integers(spec.output_tokens[0], spec.output_tokens[1] + 1, size=arrivals.size)
    n = arrivals.size
    picks = rng.choice(len(spec.adapters), size=n, p=spec.popularity) if spec.adapters else np.zeros(n)
    is_base = rng.random(n) < spec.base_fraction if spec.adapters else np.ones(n, dtype=bool)
    if spec.shift is not None and spec.adapters:
        shifted = arrivals >= spec.shift.at_s
        picks = np.where(shifted, (picks + spec.shift.rotate) % len(spec.adapters), picks)
    requests: list[SimRequest] = []
    for i in range(n):
        adapter = "" if is_base[i] else spec.adapters[int(picks[i])]
        requests.append(_request(spec, i, float(arrivals[i]), adapter, int(prompts[i]), int(outputs[i])))
    return requests


def _request(
    spec: WorkloadSpec, index: int, arrival_s: float, adapter: str, prompt: int, output: int
) -> SimRequest:
    prefix = spec.system_prompt_tokens
    return SimRequest(
        index=index,
        arrival_s=arrival_s,
        adapter=adapter,
        prompt_tokens=min(spec.max_prompt_tokens, prompt + prefix),
        output_tokens=output,
        prefix_key=f"system:{adapter or 'base'}" if prefix else "",
        prefix_tokens=prefix,
    )


def normal_rate_rps(spec: WorkloadSpec, adapter: int, at_s: float) -> float:
    """Adapter `adapter`'s mean arrival rate at `at_s` without a flood.

    Generated arrivals: `rate_rps` (a diurnal swing's mean) × its share; a trace: the trace's mean
    rate over the run × its share. Its share is its popularity as a popularity shift has it at
    `at_s`, of the requests that name an adapter.
    """
    if spec.trace is not None:
        rows = sum(1 for r in spec.trace if r.offset_s / spec.trace_time_scale < spec.duration_s)
        rate = rows / spec.duration_s
    else:
        rate = spec.rate_rps
    index = adapter
    if spec.shift is not None and at_s >= spec.shift.at_s:
        index = (adapter - spec.shift.rotate) % len(spec.adapters)
    return rate * (1.0 - spec.base_fraction) * float(spec.popularity[index])


def flood_arrivals(spec: WorkloadSpec, flood: Flood, rng: np.random.Generator) -> np.ndarray:
    """The flood's extra arrival times: Poisson at (factor − 1) × the adapter's normal rate, within
    the window and the run."""
    extra = (flood.factor - 1.0) * normal_rate_rps(spec, flood.adapter, flood.at_s)
    end = min(flood.end_s, spec.duration_s)
    if extra <= 0 or end <= flood.at_s:
        return np.array([])
    return flood.at_s + gamma_arrivals(rng, extra, 1.0, end - flood.at_s)


def _with_flood(
    spec: WorkloadSpec, flood: Flood, requests: list[SimRequest], rng: np.random.Generator
) -> list[SimRequest]:
    """`requests` with the flood's arrivals merged in, every request re-indexed in arrival order."""
    times = flood_arrivals(spec, flood, rng)
    if times.size == 0:
        return requests
    prompts = rng.integers(spec.prompt_tokens[0], spec.prompt_tokens[1] + 1, size=times.size)
    outputs = rng.integers(spec.output_tokens[0], spec.output_tokens[1] + 1, size=times.size)
    adapter = spec.adapters[flood.adapter]
    extra = [
        _request(spec, 0, float(t), adapter, int(p), int(o))
        for t, p, o in zip(times, prompts, outputs, strict=True)
    ]
    # Stable: a base request and a flood request at the same instant keep base-first order.
    merged = sorted([*requests, *extra], key=lambda r: r.arrival_s)
    for i, request in enumerate(merged):
        request.index = i
    return merged


def _draw_tenants(tenants: Tenants, requests: list[SimRequest], rng: np.random.Generator) -> None:
    if tenants.by_adapter:
        for request in requests:
            request.tenant = request.adapter or BASE_TENANT
        return
    names = tenants.names()
    picks = rng.integers(0, len(names), size=len(requests))
    for request, pick in zip(requests, picks, strict=True):
        request.tenant = names[int(pick)]


def _draw_objectives(
    classes: Sequence[PriorityClass], requests: list[SimRequest], rng: np.random.Generator
) -> None:
    shares = np.array([c.share for c in classes], dtype=float)
    picks = rng.choice(len(classes), size=len(requests), p=shares / shares.sum())
    for request, pick in zip(requests, picks, strict=True):
        request.objective = classes[int(pick)].objective


_CHARS_PER_TOKEN = 4  # the prefix scorer's own approximation
_PROMPT_CHAR_LIMIT = 64 * 256  # the prefix scorer reads at most 256 blocks of 64 characters


def prompt_text(request: SimRequest) -> str:
    """Prompt text for the scheduler's prefix hashing: shared prefix text, then a unique part.

    Lengths follow the token counts at 4 characters per token, cut where the prefix scorer
    stops reading, so matched blocks / total blocks tracks the simulated prefix hit.
    """
    prefix_chars = min(_PROMPT_CHAR_LIMIT, request.prefix_tokens * _CHARS_PER_TOKEN)
    prefix = _repeat(f"<{request.prefix_key}> you are a helpful assistant. ", prefix_chars)
    unique_chars = min(
        _PROMPT_CHAR_LIMIT - prefix_chars,
        (request.prompt_tokens - request.prefix_tokens) * _CHARS_PER_TOKEN,
    )
    return prefix + _repeat(f"[request {request.index}] ", unique_chars)


def _repeat(unit: str, length: int) -> str:
    if length <= 0:
        return ""
    return (unit * (length // len(unit) + 1))[:length]
