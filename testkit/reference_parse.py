"""The page parser's rules over a full `prometheus_client` parse: the reference the fast path is held to.

`epp.picker.scrape.parse.parse_metrics` tokenises only the lines it needs; this parses the whole
page and hands the same samples to the same rules (`metrics_from_samples`), so a test can show
the filter loses nothing, and `benchmarks/scrape_cost.py` what it saves.
"""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from epp.picker.datastore.types import Metrics
from epp.picker.scrape.parse import (
    BLOCK_SIZE_LABEL,
    DEFAULT_NAMES,
    NUM_GPU_BLOCKS_LABEL,
    MetricNames,
    MetricsParseError,
    metrics_from_samples,
)


def _label_int(sample: Sample, label: str) -> int | None:
    try:
        return int(sample.labels[label])
    except (KeyError, ValueError):
        return None


def parse_metrics_unfiltered(
    text: str,
    now: float,
    *,
    served_model_name: str | None = None,
    names: MetricNames = DEFAULT_NAMES,
    previous: Metrics | None = None,
) -> Metrics:
    try:
        parsed = list(text_string_to_metric_families(text))
    except ValueError as err:  # prometheus_client reports every syntax error as ValueError
        raise MetricsParseError(f"malformed metrics exposition: {err}") from err
    samples = [sample for family in parsed for sample in family.samples]
    wanted = (*names.wanted(), names.cache_info)
    # prometheus_client drops `_total` from a counter's family name; put it back to get the
    # name the page declared.
    declared = {f.name + "_total" if f.type == "counter" else f.name for f in parsed}
    present = declared | {s.name for s in samples}
    cache_samples = [s for s in samples if s.name == names.cache_info]
    capacity = (
        (_label_int(cache_samples[0], BLOCK_SIZE_LABEL), _label_int(cache_samples[0], NUM_GPU_BLOCKS_LABEL))
        if cache_samples
        else (None, None)
    )
    return metrics_from_samples(
        samples,
        frozenset(name for name in wanted if name in present),
        now,
        capacity=capacity,
        served_model_name=served_model_name,
        names=names,
        previous=previous,
    )
