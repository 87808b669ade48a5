"""The shipped Grafana dashboard only queries metrics the EPP (or prometheus_client) exports."""

from __future__ import annotations

import json
import pathlib
import re

from prometheus_client import CollectorRegistry

from epp.clock import FakeClock
from epp.picker.datastore.types import Metrics
from epp.picker.observability.metrics import EppMetrics, PoolCollector
from tests.support.fake_scheduler import pool_datastore

DASHBOARD = pathlib.Path(__file__).parents[4] / "charts/inferencepool/dashboards/epp-dashboard.json"
PROCESS_METRICS = {"process_cpu_seconds_total", "process_resident_memory_bytes"}
FUNCTIONS = {"sum", "by", "rate", "histogram_quantile", "le"}


def exported_names() -> set[str]:
    clock = FakeClock()
    store = pool_datastore(clock=clock)
    store.update_metrics("pod-0-rank-0", Metrics(updated_at=clock.now()))
    registry = CollectorRegistry()
    EppMetrics(registry)
    registry.register(PoolCollector(store, clock))
    names: set[str] = set()
    for family in registry.collect():
        names.add(family.name)
        names.update(sample.name for sample in family.samples)
        for suffix in ("_bucket", "_sum", "_count", "_total"):
            names.add(family.name + suffix)
    return names


def queried_names(expr: str) -> set[str]:
    without_grouping = re.sub(r"\bby\s*\([^)]*\)", "", expr)
    without_labels = re.sub(r"\{[^}]*\}", "", without_grouping)
    without_ranges = re.sub(r"\[[^\]]*\]", "", without_labels)
    words = set(re.findall(r"[a-zA-Z_:][a-zA-Z0-9_:]*", without_ranges))
    return {w for w in words if "_" in w and w not in FUNCTIONS}


def test_every_panel_queries_exported_metrics() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    exported = exported_names() | PROCESS_METRICS
    assert dashboard["panels"]
    for panel in dashboard["panels"]:
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            missing = queried_names(target["expr"]) - exported
            assert not missing, (panel["title"], missing)


def test_panel_ids_are_unique() -> None:
    panels = json.loads(DASHBOARD.read_text())["panels"]
    assert len({p["id"] for p in panels}) == len(panels)
