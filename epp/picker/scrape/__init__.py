"""Scrape model servers' `/metrics` per endpoint and parse them into `Metrics`."""

from epp.picker.scrape.parse import DEFAULT_NAMES, MetricNames, MetricsParseError, parse_metrics
from epp.picker.scrape.refresher import MetricsRefresher, ScrapeStats

__all__ = [
    "DEFAULT_NAMES",
    "MetricNames",
    "MetricsParseError",
    "MetricsRefresher",
    "ScrapeStats",
    "parse_metrics",
]
