"""Frozen values the datastore holds and publishes.

Sources (`epp.sources`) build these from Kubernetes objects; metrics refreshers build
`Metrics`; the scheduler only ever reads them through a `Snapshot`.
"""

from __future__ import annotations

import enum
import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType

EMPTY_LABELS: Mapping[str, str] = MappingProxyType({})


class FailureMode(enum.Enum):
    FAIL_OPEN = "FailOpen"
    FAIL_CLOSE = "FailClose"


class Criticality(enum.Enum):
    """InferenceModel criticality; unset is treated as Standard, as upstream does."""

    CRITICAL = "Critical"
    STANDARD = "Standard"
    SHEDDABLE = "Sheddable"


def format_address(ip: str, port: int) -> str:
    """`ip:port`, with IPv6 in brackets as upstream v1.0+ writes it."""
    if ":" not in ip:  # never IPv6; skips the parse, as this runs for every routed request
        return f"{ip}:{port}"
    try:
        if ipaddress.ip_address(ip).version == 6:
            return f"[{ip}]:{port}"
    except ValueError:
        pass
    return f"{ip}:{port}"


@dataclass(frozen=True, slots=True)
class Pool:
    """An InferencePool, normalised across the v1 and x-k8s v1alpha2 API versions."""

    name: str
    namespace: str
    selector: Mapping[str, str]
    target_ports: tuple[int, ...]
    failure_mode: FailureMode = FailureMode.FAIL_CLOSE
    group: str = "inference.networking.k8s.io"
    endpoint_picker_name: str = ""
    endpoint_picker_port: int | None = None
    resource_version: str = ""
    # spec.appProtocol (v1.4.0+): "http" or "kubernetes.io/h2c", for every target port.
    app_protocol: str = "http"


@dataclass(frozen=True, slots=True)
class PodInfo:
    """What the EPP needs of a Pod to decide whether and where it is an endpoint."""

    name: str
    namespace: str
    ip: str
    labels: Mapping[str, str] = field(default_factory=lambda: EMPTY_LABELS)
    ready: bool = True
    deleting: bool = False
    # Target ports restricted by the `inference.networking.k8s.io/active-ports` annotation; None = all.
    active_ports: frozenset[int] | None = None
    resource_version: str = ""


@dataclass(frozen=True, slots=True)
class Endpoint:
    """One routable `podIP:port`; a pod has one endpoint per pool target port."""

    name: str  # "<pod>-rank-<index>", as upstream names them
    pod_name: str
    namespace: str
    ip: str
    port: int
    labels: Mapping[str, str] = field(default_factory=lambda: EMPTY_LABELS, compare=False)

    @property
    def address(self) -> str:
        return format_address(self.ip, self.port)


@dataclass(frozen=True, slots=True)
class TargetModel:
    name: str
    weight: int | None = None


@dataclass(frozen=True, slots=True)
class InferenceModel:
    """An InferenceModel (x-k8s v1alpha2): a client-facing model name and its weighted targets."""

    name: str  # metadata.name
    namespace: str
    model_name: str  # spec.modelName, what clients put in body `model`
    pool_name: str
    criticality: Criticality | None = None
    target_models: tuple[TargetModel, ...] = ()
    creation_timestamp: float = 0.0  # Unix seconds; the oldest wins a modelName conflict
    uid: str = ""
    resource_version: str = ""
    pool_group: str = ""  # spec.poolRef.group, schema default applied; "" when built by hand


@dataclass(frozen=True, slots=True)
class InferenceObjective:
    """An InferenceObjective: a priority a request selects by header (`< 0` is sheddable)."""

    name: str
    namespace: str
    pool_name: str
    priority: int = 0
    creation_timestamp: float = 0.0
    uid: str = ""
    resource_version: str = ""
    pool_group: str = ""  # spec.poolRef.group, schema default applied; "" when built by hand


@dataclass(frozen=True, slots=True)
class Metrics:
    """One scrape of a model server, as parsed from vLLM `/metrics`.

    Replaced whole on every scrape, never edited.
    """

    updated_at: float  # Clock time the scrape completed
    waiting_requests: int = 0  # vllm:num_requests_waiting
    running_requests: int = 0  # vllm:num_requests_running
    deferred_requests: int = 0  # vllm:num_requests_waiting_by_reason{reason="deferred"}: slot pressure
    kv_cache_usage: float = 0.0  # 0..1, as vLLM reports it
    lora_enabled: bool = False  # the lora_requests_info family was present
    max_lora: int = 0
    running_adapters: frozenset[str] = frozenset()
    waiting_adapters: frozenset[str] = frozenset()
    block_size: int | None = None  # cache_config_info
    num_gpu_blocks: int | None = None
    served_model_name: str | None = None  # the base model (model_name label)

    @property
    def active_adapters(self) -> frozenset[str]:
        """Adapters with a request in flight (running ∪ waiting; real vLLM reports both alike)."""
        return self.running_adapters | self.waiting_adapters


@dataclass(frozen=True, slots=True)
class AdapterState:
    """A pod's LoRA adapters as its adapter-state sidecar (`epp sidecar`) last pushed them."""

    received_at: float  # Clock time the State arrived
    registered: frozenset[str] = frozenset()  # what the model server serves now (GET /v1/models)
    running_adapters: frozenset[str] = frozenset()
    waiting_adapters: frozenset[str] = frozenset()
    max_lora: int = 0  # 0 = unknown: the scraped value stands
    version: int = 0  # the sidecar's State.version


def with_adapter_state(metrics: Metrics, pushed: AdapterState) -> Metrics:
    """The scrape with the adapter fields of whichever reading is newer.

    A push newer than the scrape replaces running/waiting adapters and max_lora and moves
    `updated_at` to its arrival, so consumers that fold a reading once per `updated_at` (the
    residency model) see it at once. Queue and cache figures always come from the scrape, and
    a failing scrape still makes the endpoint stale: push state never makes a pod routable.
    """
    if pushed.received_at < metrics.updated_at:
        return metrics
    return replace(
        metrics,
        updated_at=pushed.received_at,
        lora_enabled=metrics.lora_enabled or pushed.max_lora > 0,
        max_lora=pushed.max_lora or metrics.max_lora,
        running_adapters=pushed.running_adapters,
        waiting_adapters=pushed.waiting_adapters,
    )


@dataclass(frozen=True, slots=True)
class EndpointState:
    """An endpoint with its newest metrics, as the scheduler sees it."""

    endpoint: Endpoint
    # None until the first successful scrape; with push state up, the merge of both
    # (`with_adapter_state`).
    metrics: Metrics | None = None
    scrape_failures: int = 0  # consecutive failures since the last success
    last_error: str = ""
    adapter_state: AdapterState | None = None  # None while no sidecar stream is up

    @property
    def name(self) -> str:
        return self.endpoint.name

    @property
    def address(self) -> str:
        return self.endpoint.address

    def is_fresh(self, now: float, staleness_threshold_s: float) -> bool:
        """True when the newest metrics are younger than the threshold and the last scrape succeeded."""
        return (
            self.metrics is not None
            and self.scrape_failures == 0
            and now - self.metrics.updated_at <= staleness_threshold_s
        )


@dataclass(frozen=True, slots=True)
class Snapshot:
    """An immutable view of the pool taken once per request, so a decision sees one consistent state."""

    pool: Pool | None
    endpoints: tuple[EndpointState, ...]
    models: Mapping[str, InferenceModel]  # by spec.modelName; conflict winners only
    objectives: Mapping[str, InferenceObjective]  # by metadata.name
    taken_at: float
    version: int

    @property
    def has_model_registry(self) -> bool:
        return bool(self.models)

    def endpoint(self, name: str) -> EndpointState | None:
        for state in self.endpoints:
            if state.endpoint.name == name:
                return state
        return None
