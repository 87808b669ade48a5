"""Pool, models/objectives, endpoints and metrics; publishes immutable snapshots."""

from epp.picker.datastore.store import Datastore, ModelStatus
from epp.picker.datastore.types import (
    AdapterState,
    Criticality,
    Endpoint,
    EndpointState,
    FailureMode,
    InferenceModel,
    InferenceObjective,
    Metrics,
    PodInfo,
    Pool,
    Snapshot,
    TargetModel,
    format_address,
)

__all__ = [
    "AdapterState",
    "Criticality",
    "Datastore",
    "Endpoint",
    "EndpointState",
    "FailureMode",
    "InferenceModel",
    "InferenceObjective",
    "Metrics",
    "ModelStatus",
    "PodInfo",
    "Pool",
    "Snapshot",
    "TargetModel",
    "format_address",
]
