"""Builders for endpoint states, snapshots and policy configs used across scheduling tests."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from epp.picker.datastore.types import Endpoint, EndpointState, Metrics, Snapshot
from epp.picker.scheduling.policies import policy_config_text

BASE = "base-model"


def endpoint_state(
    index: int,
    *,
    updated_at: float | None = 0.0,
    waiting: int = 0,
    running: int = 0,
    kv: float = 0.0,
    max_lora: int = 2,
    active: Iterable[str] = (),
    deferred: int = 0,
    scrape_failures: int = 0,
    lora_enabled: bool = True,
) -> EndpointState:
    endpoint = Endpoint(
        name=f"pod-{index}-rank-0",
        pod_name=f"pod-{index}",
        namespace="ns",
        ip=f"127.0.0.{index + 1}",
        port=8000,
    )
    metrics = (
        None
        if updated_at is None
        else Metrics(
            updated_at=updated_at,
            waiting_requests=waiting,
            running_requests=running,
            deferred_requests=deferred,
            kv_cache_usage=kv,
            lora_enabled=lora_enabled,
            max_lora=max_lora if lora_enabled else 0,
            running_adapters=frozenset(active),
            waiting_adapters=frozenset(active),
            served_model_name=BASE,
        )
    )
    return EndpointState(endpoint=endpoint, metrics=metrics, scrape_failures=scrape_failures)


def snapshot_of(states: Sequence[EndpointState], taken_at: float = 0.0) -> Snapshot:
    return Snapshot(
        pool=None, endpoints=tuple(states), models={}, objectives={}, taken_at=taken_at, version=1
    )


def config_text(policy: str) -> str:
    """The EndpointPickerConfig YAML of a config-defined policy (`default`, `gie-v1`)."""
    text = policy_config_text(policy)
    assert text is not None, f"{policy!r} is a hand-written baseline, not a config"
    return text
