"""Kubernetes objects → datastore values: every schema rule, good and bad, and what the
datastore then routes to."""

from __future__ import annotations

import copy
import datetime
from collections.abc import Callable
from typing import Any

import pytest
import yaml

from epp.clock import FakeClock
from epp.errors import ConfigError
from epp.picker.datastore import (
    Criticality,
    Datastore,
    FailureMode,
    InferenceModel,
    PodInfo,
    Pool,
    TargetModel,
)
from epp.picker.sources.objects import (
    INFERENCE_MODEL,
    INFERENCE_OBJECTIVE,
    POOL_V1,
    POOL_V1ALPHA2,
    ObjectError,
    parse_inference_model,
    parse_inference_objective,
    parse_object,
    parse_objects,
    parse_pod,
    parse_pool,
    pool_resource,
)

Obj = dict[str, Any]
Mutation = Callable[[Obj], None]


def pool_v1(**spec: Any) -> Obj:
    base: Obj = {
        "apiVersion": "inference.networking.k8s.io/v1",
        "kind": "InferencePool",
        "metadata": {"name": "vllm-pool", "namespace": "ns", "resourceVersion": "42"},
        "spec": {
            "selector": {"matchLabels": {"app": "vllm"}},
            "targetPorts": [{"number": 8000}],
            "endpointPickerRef": {"name": "epp", "port": {"number": 9002}},
        },
    }
    base["spec"].update(spec)
    return base


def pool_v1alpha2(**spec: Any) -> Obj:
    base: Obj = {
        "apiVersion": "inference.networking.x-k8s.io/v1alpha2",
        "kind": "InferencePool",
        "metadata": {"name": "old-pool", "namespace": "ns"},
        "spec": {"selector": {"app": "vllm"}, "targetPortNumber": 8000, "extensionRef": {"name": "epp"}},
    }
    base["spec"].update(spec)
    return base


def pod(
    name: str = "vllm-0",
    ip: str | None = "10.0.0.1",
    *,
    labels: dict[str, str] | None = None,
    conditions: list[dict[str, str]] | None = None,
    annotations: dict[str, str] | None = None,
    **metadata: Any,
) -> Obj:
    status: Obj = {}
    if ip is not None:
        status["podIP"] = ip
    if conditions is not None:
        status["conditions"] = conditions
    meta: Obj = {"name": name, "namespace": "ns", "labels": labels or {"app": "vllm"}, **metadata}
    if annotations is not None:
        meta["annotations"] = annotations
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "status": status}


def model(name: str = "legal", **spec: Any) -> Obj:
    base: Obj = {
        "apiVersion": "inference.networking.x-k8s.io/v1alpha2",
        "kind": "InferenceModel",
        "metadata": {"name": name, "namespace": "ns"},
        "spec": {"modelName": "legal-assistant", "poolRef": {"name": "vllm-pool"}},
    }
    base["spec"].update(spec)
    return base


def objective(name: str = "batch", **spec: Any) -> Obj:
    base: Obj = {
        "apiVersion": "inference.networking.x-k8s.io/v1alpha2",
        "kind": "InferenceObjective",
        "metadata": {"name": name, "namespace": "ns"},
        "spec": {"poolRef": {"name": "vllm-pool"}},
    }
    base["spec"].update(spec)
    return base


READY = [{"type": "Ready", "status": "True"}]


def at(path: str, value: Any) -> Mutation:
    """Set a dotted path (list indexes as numbers) in an object."""

    def mutate(obj: Obj) -> None:
        keys: list[Any] = [int(k) if k.isdigit() else k for k in path.split(".")]
        target: Any = obj
        for key in keys[:-1]:
            target = target[key]
        target[keys[-1]] = value

    return mutate


def drop(path: str) -> Mutation:
    def mutate(obj: Obj) -> None:
        keys: list[Any] = [int(k) if k.isdigit() else k for k in path.split(".")]
        target: Any = obj
        for key in keys[:-1]:
            target = target[key]
        del target[keys[-1]]

    return mutate


# -- ObjectError -----------------------------------------------------------------------------


def test_error_message_names_kind_object_and_field() -> None:
    with pytest.raises(ObjectError) as caught:
        parse_pool(pool_v1(targetPorts=[{"number": 0}]))
    err = caught.value
    assert str(err) == 'InferencePool "vllm-pool": spec.targetPorts[0].number: must be 1-65535, got 0'
    assert (err.kind, err.name, err.field) == ("InferencePool", "vllm-pool", "spec.targetPorts[0].number")
    assert isinstance(err, ConfigError)


# -- InferencePool v1 ------------------------------------------------------------------------


def test_v1_pool_is_normalised() -> None:
    pool = parse_pool(pool_v1())
    assert pool == Pool(
        name="vllm-pool",
        namespace="ns",
        selector={"app": "vllm"},
        target_ports=(8000,),
        failure_mode=FailureMode.FAIL_CLOSE,
        group="inference.networking.k8s.io",
        endpoint_picker_name="epp",
        endpoint_picker_port=9002,
        resource_version="42",
        app_protocol="http",
    )


@pytest.mark.parametrize(
    ("mutate", "check"),
    [
        (
            at("spec.targetPorts", [{"number": p} for p in range(8000, 8008)]),
            ("target_ports", tuple(range(8000, 8008))),
        ),
        (at("spec.endpointPickerRef.failureMode", "FailOpen"), ("failure_mode", FailureMode.FAIL_OPEN)),
        (at("spec.appProtocol", "kubernetes.io/h2c"), ("app_protocol", "kubernetes.io/h2c")),
        (drop("spec.endpointPickerRef"), ("endpoint_picker_name", "")),
        (
            at("spec.endpointPickerRef", {"name": "picker", "kind": "Backend", "group": "example.com"}),
            ("endpoint_picker_port", None),
        ),
        (drop("metadata.namespace"), ("namespace", "fallback")),
        (
            at("spec.selector.matchLabels", {"app.kubernetes.io/name": "vllm", "tier": ""}),
            ("selector", {"app.kubernetes.io/name": "vllm", "tier": ""}),
        ),
    ],
    ids=[
        "eight-ports",
        "fail-open",
        "h2c",
        "no-picker-ref",
        "non-service-picker",
        "default-namespace",
        "labels",
    ],
)
def test_v1_pool_fields(mutate: Mutation, check: tuple[str, Any]) -> None:
    obj = pool_v1()
    mutate(obj)
    pool = parse_pool(obj, default_namespace="fallback")
    assert getattr(pool, check[0]) == check[1]


BAD_V1 = [
    (drop("metadata"), "metadata", "is required"),
    (drop("metadata.name"), "metadata.name", "is required"),
    (at("metadata.name", "Vllm_Pool"), "metadata.name", "DNS subdomain"),
    (at("metadata.namespace", "a.b"), "metadata.namespace", "DNS label"),
    (drop("spec"), "spec", "is required"),
    (at("spec", "pool"), "spec", "must be an object"),
    (drop("spec.selector"), "spec.selector", "is required"),
    (drop("spec.selector.matchLabels"), "spec.selector.matchLabels", "is required"),
    (at("spec.selector.matchLabels", {}), "spec.selector.matchLabels", "1-64 labels"),
    (
        at("spec.selector.matchLabels", {f"k{i}": "v" for i in range(65)}),
        "spec.selector.matchLabels",
        "1-64 labels, got 65",
    ),
    (at("spec.selector.matchLabels", {"app": 3}), "spec.selector.matchLabels.app", "must be a string"),
    (drop("spec.targetPorts"), "spec.targetPorts", "is required"),
    (at("spec.targetPorts", []), "spec.targetPorts", "1-8 ports, got 0"),
    (
        at("spec.targetPorts", [{"number": 8000 + i} for i in range(9)]),
        "spec.targetPorts",
        "1-8 ports, got 9",
    ),
    (at("spec.targetPorts", {"number": 8000}), "spec.targetPorts", "must be a list"),
    (at("spec.targetPorts", [8000]), "spec.targetPorts[0]", "must be an object"),
    (at("spec.targetPorts", [{}]), "spec.targetPorts[0].number", "is required"),
    (at("spec.targetPorts", [{"number": 65536}]), "spec.targetPorts[0].number", "must be 1-65535, got 65536"),
    (at("spec.targetPorts", [{"number": "8000"}]), "spec.targetPorts[0].number", "must be an integer"),
    (at("spec.targetPorts", [{"number": True}]), "spec.targetPorts[0].number", "must be an integer"),
    (at("spec.targetPorts", [{"number": 8000.5}]), "spec.targetPorts[0].number", "must be an integer"),
    (
        at("spec.targetPorts", [{"number": 8000}, {"number": 8001}, {"number": 8000}]),
        "spec.targetPorts[2].number",
        "unique",
    ),
    (at("spec.appProtocol", "grpc"), "spec.appProtocol", "must be one of http, kubernetes.io/h2c"),
    (drop("spec.endpointPickerRef.name"), "spec.endpointPickerRef.name", "is required"),
    (at("spec.endpointPickerRef.name", ""), "spec.endpointPickerRef.name", "must not be empty"),
    (at("spec.endpointPickerRef.name", "e" * 254), "spec.endpointPickerRef.name", "at most 253"),
    (drop("spec.endpointPickerRef.port"), "spec.endpointPickerRef.port", "required when kind is Service"),
    (at("spec.endpointPickerRef.port", {}), "spec.endpointPickerRef.port.number", "is required"),
    (at("spec.endpointPickerRef.port", {"number": 0}), "spec.endpointPickerRef.port.number", "1-65535"),
    (at("spec.endpointPickerRef.failureMode", "failOpen"), "spec.endpointPickerRef.failureMode", "FailOpen"),
    (at("spec.endpointPickerRef.kind", "9Service"), "spec.endpointPickerRef.kind", "valid kind"),
    (at("spec.endpointPickerRef.kind", ""), "spec.endpointPickerRef.kind", "must not be empty"),
    (at("spec.endpointPickerRef.group", "Example.com"), "spec.endpointPickerRef.group", "DNS subdomain"),
    (at("apiVersion", "inference.networking.k8s.io/v2"), "apiVersion", "must be"),
]


@pytest.mark.parametrize(("mutate", "field", "problem"), BAD_V1, ids=[f"{f}:{p}" for _, f, p in BAD_V1])
def test_v1_pool_rejects(mutate: Mutation, field: str, problem: str) -> None:
    obj = pool_v1()
    mutate(obj)
    with pytest.raises(ObjectError) as caught:
        parse_pool(obj)
    assert caught.value.field == field
    assert caught.value.kind == "InferencePool"
    assert problem in caught.value.problem
    assert field in str(caught.value)


# -- label rules (shared by every selector and pod labels) ------------------------------------

GOOD_LABELS = [
    ("app", "vllm"),
    ("app.kubernetes.io/name", "vllm"),
    ("a", ""),
    ("A_b.c-D9", "x_y.z-0"),
    ("k" * 63, "v" * 63),
    ("example.com/" + "k" * 63, "v"),
]
BAD_LABELS = [
    ("", "v", "must not be empty"),
    ("-app", "v", "label key"),
    ("app-", "v", "label key"),
    ("k" * 64, "v", "label key"),
    ("Example.com/app", "v", "label key"),
    ("example.com/", "v", "label key"),
    ("a b", "v", "label key"),
    ("app\n", "v", "label key"),
    ("app", "vllm\n", "label value"),
    ("app", "v" * 64, "at most 63"),
    ("app", "-v", "label value"),
    ("app", "v.", "label value"),
    ("app", "a b", "label value"),
]


@pytest.mark.parametrize(("key", "value"), GOOD_LABELS, ids=[f"{k[:20]}={v[:10]}" for k, v in GOOD_LABELS])
def test_valid_labels_are_accepted_everywhere(key: str, value: str) -> None:
    assert parse_pool(pool_v1(selector={"matchLabels": {key: value}})).selector == {key: value}
    assert parse_pool(pool_v1alpha2(selector={key: value})).selector == {key: value}
    assert parse_pod(pod(labels={key: value}, conditions=READY)).labels == {key: value}


@pytest.mark.parametrize(
    ("key", "value", "problem"), BAD_LABELS, ids=[f"{k[:20]}={v[:10]}" for k, v, _ in BAD_LABELS]
)
def test_invalid_labels_are_rejected_everywhere(key: str, value: str, problem: str) -> None:
    cases: list[tuple[Callable[[Obj], object], Obj, str]] = [
        (parse_pool, pool_v1(selector={"matchLabels": {key: value}}), "spec.selector.matchLabels"),
        (parse_pool, pool_v1alpha2(selector={key: value}), "spec.selector"),
        (parse_pod, pod(labels={key: value}), "metadata.labels"),
    ]
    for parse, obj, path in cases:
        with pytest.raises(ObjectError) as caught:
            parse(obj)
        assert caught.value.field.startswith(path)
        assert problem in caught.value.problem


# -- InferencePool v1alpha2 ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("extension_ref", "port", "mode"),
    [
        ({"name": "epp"}, 9002, FailureMode.FAIL_CLOSE),
        ({"name": "epp", "portNumber": 9100, "failureMode": "FailOpen"}, 9100, FailureMode.FAIL_OPEN),
        ({"name": "epp", "kind": "Backend", "group": "example.com"}, None, FailureMode.FAIL_CLOSE),
    ],
    ids=["service-default-port", "explicit-port-fail-open", "non-service-no-port"],
)
def test_v1alpha2_pool_is_normalised(extension_ref: Obj, port: int | None, mode: FailureMode) -> None:
    pool = parse_pool(pool_v1alpha2(extensionRef=extension_ref))
    assert pool.group == "inference.networking.x-k8s.io"
    assert (pool.name, pool.namespace, pool.selector, pool.target_ports) == (
        "old-pool",
        "ns",
        {"app": "vllm"},
        (8000,),
    )
    assert (pool.endpoint_picker_name, pool.endpoint_picker_port, pool.failure_mode) == (
        extension_ref["name"],
        port,
        mode,
    )


BAD_V1ALPHA2 = [
    (drop("spec.selector"), "spec.selector", "is required"),
    (at("spec.selector", ["app=vllm"]), "spec.selector", "must be an object"),
    (drop("spec.targetPortNumber"), "spec.targetPortNumber", "is required"),
    (at("spec.targetPortNumber", 0), "spec.targetPortNumber", "must be 1-65535, got 0"),
    (drop("spec.extensionRef"), "spec.extensionRef", "is required"),
    (at("spec.extensionRef", {}), "spec.extensionRef.name", "is required"),
    (at("spec.extensionRef.portNumber", 65536), "spec.extensionRef.portNumber", "1-65535"),
    (at("spec.extensionRef.failureMode", "Open"), "spec.extensionRef.failureMode", "must be one of"),
]


@pytest.mark.parametrize(("mutate", "field", "problem"), BAD_V1ALPHA2, ids=[f for _, f, _ in BAD_V1ALPHA2])
def test_v1alpha2_pool_rejects(mutate: Mutation, field: str, problem: str) -> None:
    obj = pool_v1alpha2()
    mutate(obj)
    with pytest.raises(ObjectError) as caught:
        parse_pool(obj)
    assert (caught.value.kind, caught.value.name, caught.value.field) == ("InferencePool", "old-pool", field)
    assert problem in caught.value.problem


@pytest.mark.parametrize(
    ("obj", "field"),
    [
        (pool_v1(unknown=1), "spec.unknown"),
        (pool_v1(targetPorts=[{"number": 8000, "name": "http"}]), "spec.targetPorts[0].name"),
        (pool_v1(endpointPickerRef={"name": "e", "port": {"number": 1}, "failuremode": "FailOpen"}), None),
        (pool_v1alpha2(targetPorts=[{"number": 8000}]), "spec.targetPorts"),
    ],
    ids=["spec-typo", "port-extra", "picker-typo", "v1-field-on-v1alpha2"],
)
def test_strict_mode_rejects_unknown_fields_the_api_server_would_prune(obj: Obj, field: str | None) -> None:
    parse_pool(obj)  # lenient: objects from the API server never carry them
    with pytest.raises(ObjectError) as caught:
        parse_pool(obj, strict=True)
    assert "unknown field" in caught.value.problem
    if field is not None:
        assert caught.value.field == field


# -- Pods ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("obj", "ready", "deleting"),
    [
        (pod(conditions=READY), True, False),
        (
            pod(
                conditions=[{"type": "PodScheduled", "status": "True"}, {"type": "Ready", "status": "False"}]
            ),
            False,
            False,
        ),
        (pod(conditions=[{"type": "Ready", "status": "Unknown"}]), False, False),
        (pod(conditions=[{"type": "PodScheduled", "status": "True"}]), False, False),
        (pod(conditions=READY, deletionTimestamp="2026-01-01T00:00:00Z"), True, True),
        (pod(), False, False),
    ],
    ids=["ready", "not-ready", "unknown", "no-ready-condition", "deleting", "no-conditions"],
)
def test_pod_readiness_and_deletion(obj: Obj, ready: bool, deleting: bool) -> None:
    info = parse_pod(obj)
    assert (info.ready, info.deleting) == (ready, deleting)


@pytest.mark.parametrize(
    ("obj", "ready"),
    [(pod(), True), (pod(ip=None), False), (pod(conditions=[{"type": "Ready", "status": "False"}]), False)],
    ids=["ip-only", "no-ip", "explicit-not-ready"],
)
def test_pool_files_may_omit_conditions(obj: Obj, ready: bool) -> None:
    assert parse_pod(obj, ready_without_conditions=True).ready is ready


def test_pod_fields() -> None:
    info = parse_pod(pod(conditions=READY, resourceVersion="7"))
    assert info == PodInfo(
        name="vllm-0", namespace="ns", ip="10.0.0.1", labels={"app": "vllm"}, ready=True, resource_version="7"
    )
    assert parse_pod(pod(ip="fd00::1", conditions=READY)).ip == "fd00::1"
    obj = pod(conditions=READY)
    del obj["metadata"]["namespace"]
    assert parse_pod(obj, default_namespace="fallback").namespace == "fallback"


@pytest.mark.parametrize(
    ("annotation", "ports"),
    [
        (None, None),
        ("8000", frozenset({8000})),
        ("8000,8002", frozenset({8000, 8002})),
        (" 8000 , 8002 ", frozenset({8000, 8002})),
        ("", None),
    ],
    ids=["absent", "one", "two", "spaces", "blank-is-all"],
)
def test_active_ports_annotation(annotation: str | None, ports: frozenset[int] | None) -> None:
    annotations = None if annotation is None else {"inference.networking.k8s.io/active-ports": annotation}
    assert parse_pod(pod(annotations=annotations)).active_ports == ports


BAD_PODS = [
    (pod(ip="10.0.0.300"), "status.podIP", "IP address"),
    (pod(ip="vllm-0"), "status.podIP", "IP address"),
    (
        pod(annotations={"inference.networking.k8s.io/active-ports": "8000,http"}),
        "active-ports",
        "port numbers",
    ),
    (pod(annotations={"inference.networking.k8s.io/active-ports": "0"}), "active-ports", "port numbers"),
    (pod(conditions=[{"type": "Ready", "status": "true"}]), "status.conditions[0].status", "must be one of"),
    (pod(conditions=[{"status": "True"}]), "status.conditions[0].type", "is required"),
    (
        {**pod(), "status": {"podIP": "10.0.0.1", "conditions": {"Ready": "True"}}},
        "status.conditions",
        "must be a list",
    ),
    ({**pod(), "apiVersion": "apps/v1"}, "apiVersion", "must be v1"),
]


@pytest.mark.parametrize(("obj", "field", "problem"), BAD_PODS, ids=[f"{f}:{p}" for _, f, p in BAD_PODS])
def test_pod_rejects(obj: Obj, field: str, problem: str) -> None:
    with pytest.raises(ObjectError) as caught:
        parse_pod(obj)
    assert (caught.value.kind, caught.value.name) == ("Pod", "vllm-0")
    assert field in caught.value.field
    assert problem in caught.value.problem


def test_multi_port_pool_routes_one_endpoint_per_active_port() -> None:
    store = Datastore(FakeClock())
    store.set_pool(parse_pool(pool_v1(targetPorts=[{"number": 8000}, {"number": 8001}, {"number": 8002}])))
    store.replace_pods(
        [
            parse_pod(pod("a", "10.0.0.1", conditions=READY)),
            parse_pod(
                pod(
                    "b",
                    "10.0.0.2",
                    conditions=READY,
                    annotations={"inference.networking.k8s.io/active-ports": "8002,9999"},
                )
            ),
            parse_pod(pod("c", "10.0.0.3", conditions=[{"type": "Ready", "status": "False"}])),
            parse_pod(pod("d", "10.0.0.4", conditions=READY, deletionTimestamp="2026-01-01T00:00:00Z")),
            parse_pod(pod("e", "10.0.0.5", conditions=READY, labels={"app": "other"})),
        ]
    )
    assert sorted((e.name, e.address) for e in store.endpoints()) == [
        ("a-rank-0", "10.0.0.1:8000"),
        ("a-rank-1", "10.0.0.1:8001"),
        ("a-rank-2", "10.0.0.1:8002"),
        ("b-rank-2", "10.0.0.2:8002"),
    ]


# -- InferenceModel --------------------------------------------------------------------------


def test_inference_model_is_normalised() -> None:
    obj = model(
        criticality="Critical",
        targetModels=[{"name": "legal-v1", "weight": 90}, {"name": "legal-v2", "weight": 10}],
    )
    obj["metadata"].update(uid="u-1", resourceVersion="9", creationTimestamp="2026-01-02T03:04:05Z")
    assert parse_inference_model(obj) == InferenceModel(
        name="legal",
        namespace="ns",
        model_name="legal-assistant",
        pool_name="vllm-pool",
        criticality=Criticality.CRITICAL,
        target_models=(TargetModel("legal-v1", 90), TargetModel("legal-v2", 10)),
        creation_timestamp=datetime.datetime(2026, 1, 2, 3, 4, 5, tzinfo=datetime.UTC).timestamp(),
        uid="u-1",
        resource_version="9",
        pool_group="inference.networking.x-k8s.io",
    )


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        (None, 0.0),
        ("1970-01-01T00:01:40Z", 100.0),
        ("1970-01-01T01:01:40+01:00", 100.0),
        ("1970-01-01T00:01:40.5Z", 100.5),
        (datetime.datetime(1970, 1, 1, 0, 1, 40, tzinfo=datetime.UTC), 100.0),
    ],
    ids=["absent", "utc", "offset", "fraction", "datetime"],
)
def test_creation_timestamp_is_unix_seconds(value: Any, seconds: float) -> None:
    obj = model()
    if value is not None:
        obj["metadata"]["creationTimestamp"] = value
    assert parse_inference_model(obj).creation_timestamp == seconds


def test_unquoted_yaml_timestamps_are_understood() -> None:
    obj = yaml.safe_load(
        "apiVersion: inference.networking.x-k8s.io/v1alpha2\nkind: InferenceModel\n"
        "metadata: {name: m, creationTimestamp: 1970-01-01T00:01:40Z}\n"
        "spec: {modelName: x, poolRef: {name: p}}\n"
    )
    assert parse_inference_model(obj).creation_timestamp == 100.0


@pytest.mark.parametrize(
    ("criticality", "expected"),
    [
        (None, None),
        ("Critical", Criticality.CRITICAL),
        ("Standard", Criticality.STANDARD),
        ("Sheddable", Criticality.SHEDDABLE),
    ],
    ids=["unset", "critical", "standard", "sheddable"],
)
def test_criticality(criticality: str | None, expected: Criticality | None) -> None:
    spec = {} if criticality is None else {"criticality": criticality}
    assert parse_inference_model(model(**spec)).criticality is expected


BAD_MODELS = [
    (drop("spec.modelName"), "spec.modelName", "is required"),
    (at("spec.modelName", ""), "spec.modelName", "must not be empty"),
    (at("spec.modelName", "m" * 257), "spec.modelName", "at most 256"),
    (at("spec.criticality", "critical"), "spec.criticality", "Critical, Standard, Sheddable"),
    (at("spec.targetModels", [{"name": f"t{i}"} for i in range(11)]), "spec.targetModels", "at most 10"),
    (at("spec.targetModels", [{"weight": 1}]), "spec.targetModels[0].name", "is required"),
    (at("spec.targetModels", [{"name": "t" * 254}]), "spec.targetModels[0].name", "at most 253"),
    (at("spec.targetModels", [{"name": "t", "weight": 0}]), "spec.targetModels[0].weight", "1-1000000"),
    (
        at("spec.targetModels", [{"name": "t", "weight": 1_000_001}]),
        "spec.targetModels[0].weight",
        "1-1000000",
    ),
    (
        at("spec.targetModels", [{"name": "a", "weight": 1}, {"name": "b"}]),
        "spec.targetModels[1].weight",
        "all targetModels or on none",
    ),
    (
        at("spec.targetModels", [{"name": "a"}, {"name": "b", "weight": 5}]),
        "spec.targetModels[0].weight",
        "all targetModels or on none",
    ),
    (drop("spec.poolRef"), "spec.poolRef", "is required"),
    (at("spec.poolRef", {}), "spec.poolRef.name", "is required"),
    (at("spec.poolRef.kind", "Service"), "spec.poolRef.kind", "must be InferencePool"),
    (at("metadata.creationTimestamp", "yesterday"), "metadata.creationTimestamp", "RFC 3339"),
]


@pytest.mark.parametrize(
    ("mutate", "field", "problem"), BAD_MODELS, ids=[f"{f}:{p}" for _, f, p in BAD_MODELS]
)
def test_inference_model_rejects(mutate: Mutation, field: str, problem: str) -> None:
    obj = model()
    mutate(obj)
    with pytest.raises(ObjectError) as caught:
        parse_inference_model(obj)
    assert (caught.value.kind, caught.value.name, caught.value.field) == ("InferenceModel", "legal", field)
    assert problem in caught.value.problem


def test_targets_without_weights_are_accepted() -> None:
    parsed = parse_inference_model(model(targetModels=[{"name": "a"}, {"name": "b"}]))
    assert parsed.target_models == (TargetModel("a"), TargetModel("b"))


def test_the_oldest_model_wins_a_model_name_conflict() -> None:
    store = Datastore(FakeClock())
    store.set_pool(parse_pool(pool_v1()))
    younger = model("a-younger", targetModels=[{"name": "new-adapter"}])
    younger["metadata"]["creationTimestamp"] = "2026-02-01T00:00:00Z"
    older = model("z-older", targetModels=[{"name": "old-adapter"}])
    older["metadata"]["creationTimestamp"] = "2026-01-01T00:00:00Z"
    store.replace_models([parse_inference_model(younger), parse_inference_model(older)])
    assert store.snapshot().models["legal-assistant"].name == "z-older"
    store.delete_model("ns", "z-older")
    assert store.snapshot().models["legal-assistant"].name == "a-younger"


# -- InferenceObjective ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "priority", "group"),
    [
        ({}, 0, "inference.networking.k8s.io"),
        ({"priority": 10}, 10, "inference.networking.k8s.io"),
        ({"priority": -1}, -1, "inference.networking.k8s.io"),
        (
            {"poolRef": {"name": "vllm-pool", "group": "inference.networking.x-k8s.io"}},
            0,
            "inference.networking.x-k8s.io",
        ),
    ],
    ids=["unset-is-zero", "positive", "negative-sheddable", "x-k8s-pool"],
)
def test_inference_objective(spec: Obj, priority: int, group: str) -> None:
    parsed = parse_inference_objective(objective(**spec))
    assert (parsed.name, parsed.pool_name, parsed.priority, parsed.pool_group) == (
        "batch",
        "vllm-pool",
        priority,
        group,
    )


@pytest.mark.parametrize(
    ("mutate", "field"),
    [
        (at("spec.priority", "high"), "spec.priority"),
        (at("spec.priority", True), "spec.priority"),
        (at("spec.priority", 1.5), "spec.priority"),
        (drop("spec.poolRef"), "spec.poolRef"),
        (at("spec.poolRef.name", ""), "spec.poolRef.name"),
    ],
    ids=["string", "bool", "float", "no-pool-ref", "empty-pool-name"],
)
def test_inference_objective_rejects(mutate: Mutation, field: str) -> None:
    obj = objective()
    mutate(obj)
    with pytest.raises(ObjectError) as caught:
        parse_inference_objective(obj)
    assert (caught.value.kind, caught.value.name, caught.value.field) == (
        "InferenceObjective",
        "batch",
        field,
    )


def test_objectives_select_by_name_through_the_datastore() -> None:
    store = Datastore(FakeClock())
    store.set_pool(parse_pool(pool_v1()))
    store.replace_objectives(
        [
            parse_inference_objective(objective("batch", priority=-1)),
            parse_inference_objective(objective("other-pool", poolRef={"name": "elsewhere"})),
        ]
    )
    assert {name: o.priority for name, o in store.snapshot().objectives.items()} == {"batch": -1}


# -- dispatch --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("obj", "kind"),
    [
        (pool_v1(), Pool),
        (pool_v1alpha2(), Pool),
        (pod(), PodInfo),
        (model(), InferenceModel),
        (objective(), type(parse_inference_objective(objective()))),
    ],
    ids=["pool-v1", "pool-v1alpha2", "pod", "model", "objective"],
)
def test_parse_object_dispatches_on_api_version_and_kind(obj: Obj, kind: type) -> None:
    assert isinstance(parse_object(obj, default_namespace="default"), kind)


@pytest.mark.parametrize(
    ("obj", "kind", "field", "problem"),
    [
        (
            {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "svc"}},
            "Service",
            "kind",
            "unsupported kind",
        ),
        ({"apiVersion": "v1", "metadata": {"name": "x"}}, "", "kind", "is required"),
        (
            {**pool_v1(), "apiVersion": "inference.networking.x-k8s.io/v1"},
            "InferencePool",
            "apiVersion",
            "must be",
        ),
        (
            {**model(), "apiVersion": "inference.networking.k8s.io/v1"},
            "InferenceModel",
            "apiVersion",
            "must be",
        ),
        ({"apiVersion": "v1", "kind": "List", "items": []}, "List", "kind", "parse_objects"),
    ],
    ids=["unknown-kind", "no-kind", "pool-wrong-version", "model-wrong-group", "list"],
)
def test_parse_object_rejects(obj: Obj, kind: str, field: str, problem: str) -> None:
    with pytest.raises(ObjectError) as caught:
        parse_object(obj, default_namespace="default")
    assert (caught.value.kind, caught.value.field) == (kind, field)
    assert problem in caught.value.problem
    if kind:
        assert kind in str(caught.value)


def test_parse_objects_flattens_lists() -> None:
    listed = {
        "apiVersion": "v1",
        "kind": "List",
        "items": [pool_v1(), {"apiVersion": "v1", "kind": "List", "items": [pod("a"), pod("b")]}, model()],
    }
    parsed = parse_objects(listed, default_namespace="default")
    assert [type(p).__name__ for p in parsed] == ["Pool", "PodInfo", "PodInfo", "InferenceModel"]
    assert [type(p).__name__ for p in parse_objects(pod(), default_namespace="default")] == ["PodInfo"]


def test_typed_list_items_take_kind_and_version_from_the_list() -> None:
    items = [copy.deepcopy(pod(name)) for name in ("a", "b")]
    for item in items:
        del item["apiVersion"], item["kind"]
    parsed = parse_objects({"apiVersion": "v1", "kind": "PodList", "items": items}, default_namespace="d")
    assert [p.name for p in parsed] == ["a", "b"]


def test_an_error_in_a_list_item_names_the_item() -> None:
    listed = {
        "apiVersion": "v1",
        "kind": "List",
        "items": [pool_v1(), model(targetModels=[{"name": "a", "weight": 0}])],
    }
    with pytest.raises(ObjectError) as caught:
        parse_objects(listed, default_namespace="default")
    assert (caught.value.kind, caught.value.name, caught.value.field) == (
        "InferenceModel",
        "legal",
        "spec.targetModels[0].weight",
    )


# -- API coordinates -------------------------------------------------------------------------


def test_api_coordinates() -> None:
    assert POOL_V1 == ("inference.networking.k8s.io", "v1", "inferencepools")
    assert POOL_V1ALPHA2 == ("inference.networking.x-k8s.io", "v1alpha2", "inferencepools")
    assert INFERENCE_MODEL == ("inference.networking.x-k8s.io", "v1alpha2", "inferencemodels")
    assert INFERENCE_OBJECTIVE == ("inference.networking.x-k8s.io", "v1alpha2", "inferenceobjectives")
    assert pool_resource("inference.networking.k8s.io") is POOL_V1
    assert pool_resource("inference.networking.x-k8s.io") is POOL_V1ALPHA2
    with pytest.raises(ConfigError, match="unknown InferencePool group"):
        pool_resource("example.com")
