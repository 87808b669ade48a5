"""vLLM `/metrics` text → `Metrics`, cheaply enough to run every 50–100 ms per endpoint.

A busy vLLM page is ≈ 660 lines and 58 KB; parsing all of it with `prometheus_client` costs
20+ ms of CPU, which at a 100 ms interval is a fifth of a core per endpoint. We need five
families (≈ 11 lines), so `select_lines` finds those lines with C-speed substring search and
only they go to `prometheus_client`'s parser. `vllm:cache_config_info` (one line, ~37 labels)
changes only on a restart, so it is parsed once per distinct raw line and memoised.

The tests hold it against the same rules applied to a full parse (`testkit/reference_parse.py`),
and `benchmarks/scrape_cost.py` shows what the filter saves.

Rules (vLLM 0.32.0 as observed):
- queue `num_requests_waiting` and KV `kv_cache_usage_perc` (0..1; `gpu_cache_usage_perc` only
  as a fallback) are required: a page without them raises `MetricsParseError`;
- running `num_requests_running` and deferred `num_requests_waiting_by_reason{reason="deferred"}`
  read as 0 when absent (older servers lack them);
- `lora_requests_info`: absent family ⇒ LoRA disabled; otherwise the sample with the largest
  value (a timestamp) is the current state, including the all-empty combination; zero samples ⇒
  no adapter in flight;
- `cache_config_info` labels `block_size`, `num_gpu_blocks` as ints (None when absent or not ints).
"""

from __future__ import annotations

import functools
import math
import string
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from epp.picker.datastore.types import Metrics

MODEL_NAME_LABEL = "model_name"
REASON_LABEL = "reason"
DEFERRED_REASON = "deferred"
MAX_LORA_LABEL = "max_lora"
RUNNING_ADAPTERS_LABEL = "running_lora_adapters"
WAITING_ADAPTERS_LABEL = "waiting_lora_adapters"
BLOCK_SIZE_LABEL = "block_size"
NUM_GPU_BLOCKS_LABEL = "num_gpu_blocks"

# Characters that may follow a metric name on a line that is about that metric: a sample's
# labels or value, a quoted (UTF-8) name's closing quote, blanks, or the end of a HELP line.
# Accepting too much only costs parse time (the parser still checks names); too little loses data.
_NAME_TERMINATORS = frozenset('{"' + string.whitespace)


class MetricsParseError(ValueError):
    """The page cannot give the metrics the scheduler needs; the scrape counts as failed."""


@dataclass(frozen=True, slots=True)
class MetricNames:
    """The metric (sample) names to read, as they appear on the page.

    Field ↔ upstream EPP flag: `waiting` total-queued-requests-metric, `running`
    total-running-requests-metric, `kv_usage` kv-cache-usage-percentage-metric, `lora_info`
    lora-info-metric, `cache_info` cache-info-metric. An empty `kv_usage_fallback` or
    `waiting_by_reason` disables that lookup.
    """

    waiting: str = "vllm:num_requests_waiting"
    running: str = "vllm:num_requests_running"
    waiting_by_reason: str = "vllm:num_requests_waiting_by_reason"
    kv_usage: str = "vllm:kv_cache_usage_perc"
    kv_usage_fallback: str = "vllm:gpu_cache_usage_perc"
    lora_info: str = "vllm:lora_requests_info"
    cache_info: str = "vllm:cache_config_info"

    def __post_init__(self) -> None:
        for field_name in ("waiting", "running", "kv_usage", "lora_info", "cache_info"):
            if not getattr(self, field_name):
                raise ValueError(f"metric name {field_name!r} must not be empty")

    def wanted(self) -> tuple[str, ...]:
        """Every name the parser reads, cache_info excluded (it is handled on its own)."""
        names = (
            self.waiting,
            self.running,
            self.waiting_by_reason,
            self.kv_usage,
            self.kv_usage_fallback,
            self.lora_info,
        )
        return tuple(dict.fromkeys(name for name in names if name))


DEFAULT_NAMES = MetricNames()


@dataclass(frozen=True, slots=True)
class SelectedLines:
    """The sample and TYPE lines of a page about the wanted metrics, in page order.

    `names_seen` holds every wanted name that appeared on a sample, TYPE or HELP line, which
    is how a family with zero samples (`lora_requests_info` on a fresh server) is told apart
    from an absent one.
    """

    text: str  # the selected lines of the wanted families, joined by "\n"
    cache_info_text: str  # the selected lines of the cache_info family
    names_seen: frozenset[str]


def _line_kind(head: str) -> str | None:
    """What a line is about a metric name, given `head` (the line's text before the name).

    "sample" for nothing or blanks (or `{ "`, a quoted UTF-8 name), "TYPE" / "HELP" for those
    comments with any blanks (optionally a quoted name); None when the name is not the line's
    subject (it sits in another line's labels or HELP text).
    """
    stripped = head.strip()
    if not stripped or (stripped[0] == "{" and stripped[1:].strip() == '"'):
        return "sample"
    if not stripped.startswith("#"):
        return None
    quoted = stripped.endswith('"')
    if quoted:
        stripped = stripped[:-1]
    elif not head[-1:].isspace():
        return None
    parts = stripped.split()
    if len(parts) == 2 and parts[0] == "#" and parts[1] in ("TYPE", "HELP"):
        return parts[1]
    return None


def _find_lines(text: str, name: str, found: dict[int, int]) -> bool:
    """Add (line start → line end) of each sample or TYPE line of metric `name` to `found`.

    Returns True when any line (HELP included) is about `name`. HELP lines are not kept: the
    parser needs none of their text, and tokenising long HELP strings is most of its cost.
    """
    any_found = False
    position = text.find(name)
    while position != -1:
        after = position + len(name)
        if after == len(text) or text[after] in _NAME_TERMINATORS:
            line_start = text.rfind("\n", 0, position) + 1
            kind = _line_kind(text[line_start:position])
            if kind is not None:
                any_found = True
                if kind != "HELP":
                    line_end = text.find("\n", after)
                    found[line_start] = len(text) if line_end == -1 else line_end
        position = text.find(name, after)
    return any_found


def select_lines(text: str, names: MetricNames = DEFAULT_NAMES) -> SelectedLines:
    """Pick out the lines about the wanted metrics without tokenising the rest of the page."""
    found: dict[int, int] = {}
    seen = [name for name in names.wanted() if _find_lines(text, name, found)]
    cache_found: dict[int, int] = {}
    if _find_lines(text, names.cache_info, cache_found):
        seen.append(names.cache_info)
    return SelectedLines(
        text="\n".join(text[start : found[start]] for start in sorted(found)),
        cache_info_text="\n".join(text[start : cache_found[start]] for start in sorted(cache_found)),
        names_seen=frozenset(seen),
    )


def _full_parse(text: str) -> list[Metric]:
    try:
        return list(text_string_to_metric_families(text))
    except ValueError as err:  # prometheus_client reports every syntax error as ValueError
        raise MetricsParseError(f"malformed metrics exposition: {err}") from err


def _parse_samples(text: str) -> list[Sample]:
    return [sample for family in _full_parse(text) for sample in family.samples]


def _label_int(sample: Sample, label: str) -> int | None:
    raw = sample.labels.get(label)
    if raw is None:
        return None
    try:
        return int(raw)
    except ValueError:
        return None


@functools.lru_cache(maxsize=256)
def _parse_cache_info(cache_info_text: str, cache_info_name: str) -> tuple[int | None, int | None]:
    """(block_size, num_gpu_blocks) from the cache_info lines; memoised by their raw text."""
    for sample in _parse_samples(cache_info_text):
        if sample.name == cache_info_name:
            return _label_int(sample, BLOCK_SIZE_LABEL), _label_int(sample, NUM_GPU_BLOCKS_LABEL)
    return None, None


def _split_adapters(raw: str) -> frozenset[str]:
    # vLLM joins with "," and no space; the protocol doc shows ", ". Accept both, drop empties.
    return frozenset(part.strip() for part in raw.split(",") if part.strip())


def _choose_model(samples: Sequence[Sample], wanted: str | None, previous: Metrics | None) -> str | None:
    """The model_name whose series count: the configured one, else the only one, else a stable pick.

    vLLM labels everything with its first served name, so several values mean several models
    behind one endpoint; without a configured name we keep the previous choice (or the first in
    page order) so the numbers do not flip between models from scrape to scrape.
    """
    present = list(dict.fromkeys(s.labels[MODEL_NAME_LABEL] for s in samples if MODEL_NAME_LABEL in s.labels))
    if wanted is not None:
        return wanted
    if not present:
        return None
    if previous is not None and previous.served_model_name in present:
        return previous.served_model_name
    return present[0]


def _for_model(samples: Iterable[Sample], model: str | None) -> list[Sample]:
    if model is None:
        return list(samples)
    return [s for s in samples if s.labels.get(MODEL_NAME_LABEL, model) == model]


def _finite(sample: Sample) -> float:
    value = float(sample.value)
    if not math.isfinite(value):
        raise MetricsParseError(f"{sample.name} is {value}, not a finite number")
    return value


def _count(samples: Sequence[Sample]) -> int:
    # Several series after the model filter are several engines (data parallel) of one server.
    return max(0, round(sum(_finite(s) for s in samples)))


def _lora_state(
    samples: Sequence[Sample], previous: Metrics | None
) -> tuple[int, frozenset[str], frozenset[str]]:
    """(max_lora, running, waiting) from lora_requests_info samples."""
    timestamps = [
        (float(s.value), index) for index, s in enumerate(samples) if not math.isnan(float(s.value))
    ]
    if not timestamps:
        # A fresh server has the family but no sample yet: nothing in flight. max_lora is a
        # start-up flag, so the previous scrape's value (if any) still holds.
        max_lora = previous.max_lora if previous is not None and previous.lora_enabled else 0
        return max_lora, frozenset(), frozenset()
    # Every label combination ever reported stays on the page; its value is the last time it
    # was current, so the largest value is the present state, even when that is all-empty.
    _, newest_index = max(timestamps)
    newest = samples[newest_index]
    raw_max_lora = newest.labels.get(MAX_LORA_LABEL, "0")
    try:
        max_lora = int(raw_max_lora)
    except ValueError as err:
        raise MetricsParseError(f"{newest.name} has max_lora={raw_max_lora!r}, not an integer") from err
    return (
        max_lora,
        _split_adapters(newest.labels.get(RUNNING_ADAPTERS_LABEL, "")),
        _split_adapters(newest.labels.get(WAITING_ADAPTERS_LABEL, "")),
    )


def metrics_from_samples(
    samples: Iterable[Sample],
    names_seen: frozenset[str],
    now: float,
    *,
    capacity: tuple[int | None, int | None],
    served_model_name: str | None,
    names: MetricNames,
    previous: Metrics | None,
) -> Metrics:
    """Apply the parsing rules to already-parsed samples (the part both parse paths share)."""
    by_name: dict[str, list[Sample]] = {}
    for sample in samples:
        by_name.setdefault(sample.name, []).append(sample)

    waiting_all = by_name.get(names.waiting, [])
    if not waiting_all:
        raise MetricsParseError(f"no {names.waiting} sample on the page (is this a vLLM /metrics endpoint?)")
    model = _choose_model(waiting_all, served_model_name, previous)
    waiting = _for_model(waiting_all, model)
    if not waiting:
        raise MetricsParseError(f"no {names.waiting} sample for model_name={model!r}")

    kv_samples = _for_model(by_name.get(names.kv_usage, []), model)
    if not kv_samples and names.kv_usage_fallback:
        kv_samples = _for_model(by_name.get(names.kv_usage_fallback, []), model)
    if not kv_samples:
        raise MetricsParseError(f"no {names.kv_usage} sample on the page for model_name={model!r}")
    # The fullest engine bounds what a new request can get; vLLM reports a 0..1 fraction.
    kv_cache_usage = min(1.0, max(0.0, max(_finite(s) for s in kv_samples)))

    deferred = [
        s
        for s in _for_model(by_name.get(names.waiting_by_reason, []), model)
        if s.labels.get(REASON_LABEL) == DEFERRED_REASON
    ]

    lora_enabled = names.lora_info in names_seen
    max_lora, running_adapters, waiting_adapters = (
        _lora_state(by_name.get(names.lora_info, []), previous)
        if lora_enabled
        else (0, frozenset(), frozenset())
    )

    block_size, num_gpu_blocks = capacity
    if names.cache_info not in names_seen and previous is not None:
        # The cache config is fixed for a server's lifetime; a page without it keeps what we knew.
        block_size, num_gpu_blocks = previous.block_size, previous.num_gpu_blocks

    return Metrics(
        updated_at=now,
        waiting_requests=_count(waiting),
        running_requests=_count(_for_model(by_name.get(names.running, []), model)),
        deferred_requests=_count(deferred),
        kv_cache_usage=kv_cache_usage,
        lora_enabled=lora_enabled,
        max_lora=max_lora,
        running_adapters=running_adapters,
        waiting_adapters=waiting_adapters,
        block_size=block_size,
        num_gpu_blocks=num_gpu_blocks,
        served_model_name=model,
    )


def parse_metrics(
    text: str,
    now: float,
    *,
    served_model_name: str | None = None,
    names: MetricNames = DEFAULT_NAMES,
    previous: Metrics | None = None,
) -> Metrics:
    """Parse one vLLM `/metrics` page into `Metrics` stamped `updated_at=now`.

    `served_model_name` picks the `model_name` series when a page has several; `previous` (the
    endpoint's last metrics) supplies start-up facts a page may leave out (max_lora before the
    first LoRA sample, the cache config). Raises `MetricsParseError` when the queue or KV family
    is missing or a line it needs is malformed; lines it does not need are never tokenised.
    """
    selected = select_lines(text, names)
    samples = _parse_samples(selected.text)
    capacity = (
        _parse_cache_info(selected.cache_info_text, names.cache_info)
        if selected.cache_info_text
        else (None, None)
    )
    return metrics_from_samples(
        samples,
        selected.names_seen,
        now,
        capacity=capacity,
        served_model_name=served_model_name,
        names=names,
        previous=previous,
    )
