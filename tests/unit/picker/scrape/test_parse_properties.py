"""The filtered parser reads any valid exposition exactly as a full parse does.

Pages are rendered by `prometheus_client`'s own exposition writer (the one vLLM uses), from
generated families: the wanted ones with awkward values (NaN, ±Inf, exponents), and decoys
whose names, HELP text and label values contain the wanted names, commas, quotes, backslashes
and newlines.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from epp.picker.datastore.types import Metrics
from epp.picker.scrape.parse import DEFAULT_NAMES, MetricsParseError, parse_metrics
from testkit.reference_parse import parse_metrics_unfiltered

WANTED = (
    DEFAULT_NAMES.waiting,
    DEFAULT_NAMES.running,
    DEFAULT_NAMES.waiting_by_reason,
    DEFAULT_NAMES.kv_usage,
    DEFAULT_NAMES.kv_usage_fallback,
)
DECOY_NAMES = (
    "vllm:num_requests_waiting_extra",
    "x_vllm:num_requests_waiting",
    "vllm:kv_cache_usage_perc_max",
    "vllm:lora_requests_info_total",
    "vllm:cache_config_info2",
    "vllm:prefix_cache_hits",
    "decoy",
)
AWKWARD_TEXT = st.lists(
    st.sampled_from(
        [*'ab ,"\\\n{}=#\t', "vllm:num_requests_waiting", "vllm:lora_requests_info", "# TYPE ", " 1.0"]
    ),
    max_size=12,
).map("".join)
VALUES = st.one_of(
    st.sampled_from(
        [0.0, 1.0, 8.0, 0.5, 1e-9, 1.7962154293166177e09, float("nan"), float("inf"), -float("inf")]
    ),
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(min_value=0, max_value=10**6).map(float),
)
MODEL_LABELS = st.fixed_dictionaries(
    {"engine": st.sampled_from(["0", "1"])},
    optional={"model_name": st.sampled_from(["tiny-llama", "other"])},
)
ADAPTERS = st.lists(st.sampled_from(["lora-0", "lora-1", " lora-2", "", "a b"]), max_size=3).map(",".join)


class _Families(Collector):
    def __init__(self, families: Sequence[Metric]) -> None:
        self._families = families

    def collect(self) -> Iterator[Metric]:
        yield from self._families


@st.composite
def gauge(draw: st.DrawFn, name: str) -> Metric:
    family = GaugeMetricFamily(name, draw(AWKWARD_TEXT), labels=None)
    seen: set[tuple[tuple[str, str], ...]] = set()
    for _ in range(draw(st.integers(0, 3))):
        labels = draw(MODEL_LABELS)
        if name == DEFAULT_NAMES.waiting_by_reason:
            labels["reason"] = draw(st.sampled_from(["capacity", "deferred"]))
        key = tuple(sorted(labels.items()))
        if key not in seen:  # one sample per label set, as the format requires
            seen.add(key)
            family.add_sample(name, labels, draw(VALUES))
    return family


@st.composite
def lora_family(draw: st.DrawFn) -> Metric:
    family = GaugeMetricFamily(DEFAULT_NAMES.lora_info, draw(AWKWARD_TEXT))
    seen: set[tuple[str, str]] = set()
    for _ in range(draw(st.integers(0, 4))):
        running, waiting = draw(ADAPTERS), draw(ADAPTERS)
        if (running, waiting) not in seen:
            seen.add((running, waiting))
            labels = {"max_lora": draw(st.sampled_from(["2", "4"])), "running_lora_adapters": running}
            labels["waiting_lora_adapters"] = waiting
            family.add_sample(DEFAULT_NAMES.lora_info, labels, draw(VALUES))
    return family


@st.composite
def cache_family(draw: st.DrawFn) -> Metric:
    family = GaugeMetricFamily(DEFAULT_NAMES.cache_info, "cache config")
    labels = {
        "block_size": draw(st.sampled_from(["16", "128", "None"])),
        "engine": "0",
        "num_gpu_blocks": draw(st.sampled_from(["8192", "x", "32768"])),
        "note": draw(AWKWARD_TEXT),
    }
    family.add_sample(DEFAULT_NAMES.cache_info, labels, 1.0)
    return family


@st.composite
def decoy(draw: st.DrawFn, name: str) -> Metric:
    if draw(st.booleans()):
        counter = CounterMetricFamily(name, draw(AWKWARD_TEXT), labels=["note"])
        counter.add_metric([draw(AWKWARD_TEXT)], draw(VALUES))
        return counter
    family = GaugeMetricFamily(name, draw(AWKWARD_TEXT), labels=["note", "model_name"])
    family.add_metric([draw(AWKWARD_TEXT), "tiny-llama"], draw(VALUES))
    return family


@st.composite
def exposition(draw: st.DrawFn) -> str:
    families: list[Metric] = [draw(gauge(name)) for name in WANTED if draw(st.integers(0, 4)) > 0]
    if draw(st.booleans()):
        families.append(draw(lora_family()))
    if draw(st.booleans()):
        families.append(draw(cache_family()))
    families.extend(draw(decoy(name)) for name in DECOY_NAMES if draw(st.booleans()))
    ordered = draw(st.permutations(families))
    registry = CollectorRegistry()
    registry.register(_Families(ordered))
    return generate_latest(registry).decode("utf-8")


def _outcome(parse: object, text: str, previous: Metrics | None) -> object:
    assert callable(parse)
    try:
        return parse(text, 1.0, previous=previous)
    except MetricsParseError as err:
        return f"MetricsParseError: {err}"


@settings(max_examples=150, deadline=None)
@given(text=exposition(), use_previous=st.booleans())
def test_filtered_parse_equals_full_parse(text: str, use_previous: bool) -> None:
    previous = (
        Metrics(updated_at=0.0, lora_enabled=True, max_lora=3, block_size=7, served_model_name="other")
        if use_previous
        else None
    )
    assert _outcome(parse_metrics, text, previous) == _outcome(parse_metrics_unfiltered, text, previous)
