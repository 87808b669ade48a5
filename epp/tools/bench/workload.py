"""Workloads: adapter popularity (uniform, Zipf, tiers), Gamma arrivals and trace replay.

Everything is drawn from one `numpy.random.Generator` seeded by the caller, so a seed fixes
the whole request list.
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


def generate(spec: WorkloadSpec, seed: int) -> list[SimRequest]:
    """The request list, sorted by arrival; the same spec and seed give the same list."""
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
        prefix = spec.system_prompt_tokens
        prompt = min(spec.max_prompt_tokens, int(prompts[i]) + prefix)
        requests.append(
            SimRequest(
                index=i,
                arrival_s=float(arrivals[i]),
                adapter=adapter,
                prompt_tokens=prompt,
                output_tokens=int(outputs[i]),
                prefix_key=f"system:{adapter or 'base'}" if prefix else "",
                prefix_tokens=prefix,
            )
        )
    return requests


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
