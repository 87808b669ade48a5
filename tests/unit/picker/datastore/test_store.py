"""Datastore behaviour as the scheduler and status writers observe it."""

from __future__ import annotations

import pytest

from epp.clock import FakeClock
from epp.picker.datastore import (
    Datastore,
    InferenceModel,
    InferenceObjective,
    Metrics,
    PodInfo,
    Pool,
    format_address,
)

POOL = Pool(name="pool", namespace="ns", selector={"app": "vllm"}, target_ports=(8000,))


def pod(name: str, ip: str, **kw: object) -> PodInfo:
    fields: dict[str, object] = {"name": name, "namespace": "ns", "ip": ip, "labels": {"app": "vllm"}}
    fields.update(kw)
    return PodInfo(**fields)  # type: ignore[arg-type]


@pytest.fixture
def store() -> Datastore:
    ds = Datastore(FakeClock())
    ds.set_pool(POOL)
    return ds


@pytest.mark.parametrize(
    ("pod_info", "routable"),
    [
        (pod("a", "10.0.0.1"), True),
        (pod("a", "10.0.0.1", ready=False), False),
        (pod("a", "10.0.0.1", deleting=True), False),
        (pod("a", ""), False),
        (pod("a", "10.0.0.1", labels={"app": "other"}), False),
        (pod("a", "10.0.0.1", namespace="elsewhere"), False),
    ],
    ids=["ready", "not-ready", "deleting", "no-ip", "selector-miss", "other-namespace"],
)
def test_only_ready_matching_pods_become_endpoints(
    store: Datastore, pod_info: PodInfo, routable: bool
) -> None:
    store.upsert_pod(pod_info)
    assert bool(store.snapshot().endpoints) is routable


def test_one_endpoint_per_target_port_respecting_active_ports() -> None:
    ds = Datastore(FakeClock())
    ds.set_pool(Pool(name="p", namespace="ns", selector={"app": "vllm"}, target_ports=(8000, 8001, 8002)))
    ds.upsert_pod(pod("a", "10.0.0.1"))
    assert [e.address for e in ds.endpoints()] == ["10.0.0.1:8000", "10.0.0.1:8001", "10.0.0.1:8002"]
    assert [e.name for e in ds.endpoints()] == ["a-rank-0", "a-rank-1", "a-rank-2"]
    ds.upsert_pod(pod("a", "10.0.0.1", active_ports=frozenset({8001})))
    assert [e.address for e in ds.endpoints()] == ["10.0.0.1:8001"]


def test_metrics_survive_unrelated_changes_and_reset_on_address_change(store: Datastore) -> None:
    store.upsert_pod(pod("a", "10.0.0.1"))
    store.update_metrics("a-rank-0", Metrics(updated_at=1.0, waiting_requests=3))
    store.upsert_pod(pod("b", "10.0.0.2"))
    state = store.snapshot().endpoint("a-rank-0")
    assert state is not None and state.metrics is not None and state.metrics.waiting_requests == 3
    store.upsert_pod(pod("a", "10.0.0.9"))
    moved = store.snapshot().endpoint("a-rank-0")
    assert moved is not None and moved.metrics is None and moved.address == "10.0.0.9:8000"


def test_selector_change_resyncs_endpoints(store: Datastore) -> None:
    store.replace_pods([pod("a", "10.0.0.1"), pod("b", "10.0.0.2", labels={"app": "canary"})])
    assert [e.pod_name for e in store.endpoints()] == ["a"]
    store.set_pool(Pool(name="pool", namespace="ns", selector={"app": "canary"}, target_ports=(8000,)))
    assert [e.pod_name for e in store.endpoints()] == ["b"]


def test_pool_deletion_clears_endpoints_and_readiness(store: Datastore) -> None:
    store.upsert_pod(pod("a", "10.0.0.1"))
    store.set_pool(None)
    assert not store.pool_synced
    assert store.snapshot().endpoints == ()


def test_scrape_failures_make_an_endpoint_stale_but_keep_its_metrics(store: Datastore) -> None:
    store.upsert_pod(pod("a", "10.0.0.1"))
    store.update_metrics("a-rank-0", Metrics(updated_at=10.0))
    state = store.snapshot().endpoints[0]
    assert state.is_fresh(now=10.5, staleness_threshold_s=2.0)
    assert not state.is_fresh(now=12.5, staleness_threshold_s=2.0)
    store.record_scrape_failure("a-rank-0", "connection refused")
    failed = store.snapshot().endpoints[0]
    assert failed.metrics is not None and not failed.is_fresh(now=10.5, staleness_threshold_s=2.0)
    assert failed.last_error == "connection refused"


def test_endpoint_listeners_fire_only_on_real_changes(store: Datastore) -> None:
    calls: list[int] = []
    store.on_endpoints_changed(lambda: calls.append(1))
    store.upsert_pod(pod("a", "10.0.0.1"))
    store.upsert_pod(pod("a", "10.0.0.1"))  # same pod again: no change
    store.update_metrics("a-rank-0", Metrics(updated_at=1.0))
    store.delete_pod("ns", "a")
    assert len(calls) == 2


def test_snapshot_is_cached_until_something_changes(store: Datastore) -> None:
    first = store.snapshot()
    assert store.snapshot() is first
    store.upsert_pod(pod("a", "10.0.0.1"))
    second = store.snapshot()
    assert second is not first and second.version > first.version


def model(name: str, model_name: str, created: float, pool: str = "pool") -> InferenceModel:
    return InferenceModel(
        name=name, namespace="ns", model_name=model_name, pool_name=pool, creation_timestamp=created
    )


def test_oldest_model_wins_a_name_conflict_and_the_next_takes_over(store: Datastore) -> None:
    store.replace_models([model("new", "chat", 200.0), model("old", "chat", 100.0), model("x", "other", 1.0)])
    assert store.snapshot().models["chat"].name == "old"
    statuses = {s.model.name: (s.accepted, s.reason) for s in store.model_statuses()}
    assert statuses == {"old": (True, "Accepted"), "new": (False, "ModelNameInUse"), "x": (True, "Accepted")}
    store.delete_model("ns", "old")
    assert store.snapshot().models["chat"].name == "new"


def test_models_and_objectives_of_other_pools_are_ignored(store: Datastore) -> None:
    store.upsert_model(model("m", "chat", 1.0, pool="someone-else"))
    store.upsert_objective(
        InferenceObjective(name="batch", namespace="ns", pool_name="someone-else", priority=-1)
    )
    store.upsert_objective(InferenceObjective(name="gold", namespace="ns", pool_name="pool", priority=10))
    snap = store.snapshot()
    assert dict(snap.models) == {}
    assert list(snap.objectives) == ["gold"]
    assert store.model_statuses() == []


@pytest.mark.parametrize(
    ("ip", "expected"),
    [("10.0.0.5", "10.0.0.5:8000"), ("fd00::5", "[fd00::5]:8000"), ("pod.local", "pod.local:8000")],
    ids=["ipv4", "ipv6", "hostname"],
)
def test_addresses_are_formatted_as_upstream_v1(ip: str, expected: str) -> None:
    assert format_address(ip, 8000) == expected
