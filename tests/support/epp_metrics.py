"""One figure from a running EPP's /metrics page, for tests that watch a counter or gauge move."""

from __future__ import annotations

import urllib.request

from prometheus_client.parser import text_string_to_metric_families

from epp.tools.localstack import LocalStack


def epp_metric(stack: LocalStack, sample: str, **labels: str) -> float:
    """The sum of the stack's EPP samples named `sample` (e.g. `..._total`) whose labels include
    `labels`; 0 when none is exported yet."""
    url = f"http://127.0.0.1:{stack.epp_metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=5) as response:
        text = response.read().decode()
    return sum(
        found.value
        for family in text_string_to_metric_families(text)
        for found in family.samples
        if found.name == sample and all(found.labels.get(k) == v for k, v in labels.items())
    )
