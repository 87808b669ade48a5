"""Desired objects for one LLMInferenceService: pure functions of its canonical spec.

What one object becomes (all named after it, all owned by it so deleting it deletes them):

    Deployment <name>            vLLM, LoRA on, --max-loras = maxSlots, runtime adapter updates on,
                                 and the `epp sidecar` adapter-state container next to it
    Service <name>               the model servers' port
    InferencePool <name>         selects those pods; its endpoint picker is <name>-epp
    InferenceModel <name>-<a>    one per adapter (and one for the base model)
    ConfigMap <name>-epp         scheduler.yaml (EndpointPickerConfig from `routing`), adapters.yaml
    ServiceAccount/Role/RoleBinding <name>-epp   the chart's rights for the EPP
    Deployment <name>-epp, Service <name>-epp    the EPP, reading the ConfigMap

Zero-downtime edits: both Deployments roll with maxUnavailable 0. With preloadStrategy
`demand`, the adapter list lives only in the ConfigMap and the InferenceModels, so adding
or removing a Hugging Face, PVC-already-mounted or local adapter never changes a pod
template (no restart): the EPP loads it at run time. Only a new s3:// source (an init
container fetches it) or a new Secret or PVC changes the template, and then pods roll.
Secrets are referenced by `secretKeyRef`, never copied.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from epp.operator.controller.spec import (
    API_VERSION,
    KIND,
    AdapterSource,
    AdapterSpec,
    PreloadStrategy,
    ServiceSpec,
    SourceKind,
)
from epp.picker.adapters.catalog import Catalog
from epp.picker.scheduling.picker_config import weights_from_scoring_weights

Obj = dict[str, Any]

POOL_API_VERSION = "inference.networking.k8s.io/v1"
MODEL_API_VERSION = "inference.networking.x-k8s.io/v1alpha2"
SERVICE_LABEL = "inference.llm-d.ai/service"
COMPONENT_LABEL = "app.kubernetes.io/component"
MANAGED_BY = "lora-epp-controller"
S3_DIR = "/adapters"
PVC_DIR = "/mnt/pvc"
CONFIG_DIR = "/config"  # where the chart mounts the EPP's ConfigMap
# `epp serve`'s ports, as the chart renders them: ext_proc (RenderSettings.epp_port, a flag
# when not this default), gRPC health and Prometheus metrics.
EPP_DEFAULT_PORT = 9002
EPP_HEALTH_PORT = 9003
EPP_METRICS_PORT = 9090


@dataclass(frozen=True, slots=True)
class RenderSettings:
    """Controller-wide choices (flags of `epp controller`)."""

    vllm_image: str = "vllm/vllm-openai:v0.32.0"
    epp_image: str = "lora-epp:dev"
    s3_fetch_image: str = "amazon/aws-cli:2.17.0"
    model_port: int = 8000
    epp_port: int = EPP_DEFAULT_PORT
    sidecar_port: int = 9010  # `epp sidecar` in each model-server pod; 0 leaves it out


@dataclass(frozen=True, slots=True)
class Owner:
    name: str
    namespace: str
    uid: str


def child_labels(owner: Owner, component: str) -> dict[str, str]:
    return {
        SERVICE_LABEL: owner.name,
        COMPONENT_LABEL: component,
        "app.kubernetes.io/managed-by": MANAGED_BY,
    }


def _meta(owner: Owner, name: str, component: str) -> Obj:
    return {
        "name": name,
        "namespace": owner.namespace,
        "labels": child_labels(owner, component),
        "ownerReferences": [
            {
                "apiVersion": API_VERSION,
                "kind": KIND,
                "name": owner.name,
                "uid": owner.uid,
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ],
    }


def pod_path(adapter: AdapterSpec) -> str:
    """The `lora_path` the model server loads this adapter from."""
    return _source_path(adapter.source, adapter.name)


def _source_path(source: AdapterSource, name: str) -> str:
    if source.kind is SourceKind.S3:
        return f"{S3_DIR}/{name}"
    if source.kind is SourceKind.PVC:
        return f"{PVC_DIR}/{source.claim}/{source.location}".rstrip("/")
    return source.location  # Hugging Face repo id (vLLM downloads it) or a local path


def catalog_for(spec: ServiceSpec) -> Catalog:
    return Catalog({a.name: pod_path(a) for a in spec.adapters.items}, str(spec.adapters.preload_strategy))


def _secret_env(adapters: tuple[AdapterSpec, ...], kinds: set[SourceKind]) -> list[Obj]:
    """HF_TOKEN / AWS keys from the first referenced Secret of each kind (values never copied)."""
    env: list[Obj] = []
    seen: set[str] = set()
    for adapter in adapters:
        if not adapter.secret_ref or adapter.source.kind not in kinds:
            continue
        keys = (
            ("HF_TOKEN",)
            if adapter.source.kind is SourceKind.HUGGINGFACE
            else ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")
        )
        for key in keys:
            if key in seen:
                continue
            seen.add(key)
            env.append({"name": key, "valueFrom": {"secretKeyRef": {"name": adapter.secret_ref, "key": key}}})
    return env


def model_server_deployment(owner: Owner, spec: ServiceSpec, settings: RenderSettings) -> Obj:
    adapters = spec.adapters.items
    max_slots = spec.adapters.max_slots
    args = [
        f"--model={_source_path(spec.model_source, spec.model)}",
        f"--served-model-name={spec.model}",
        f"--port={settings.model_port}",
        "--enable-lora",
        f"--max-loras={max_slots}",
        f"--max-cpu-loras={max(max_slots, len(adapters))}",
    ]
    if spec.adapters.preload_strategy is PreloadStrategy.ALL and adapters:
        args.append("--lora-modules")
        args.extend(f"{a.name}={pod_path(a)}" for a in adapters)
    env: list[Obj] = [{"name": "VLLM_ALLOW_RUNTIME_LORA_UPDATING", "value": "True"}]
    env += _secret_env(adapters, {SourceKind.HUGGINGFACE})
    volumes: list[Obj] = []
    mounts: list[Obj] = []
    claims = sorted(
        {a.source.claim for a in adapters if a.source.kind is SourceKind.PVC}
        | ({spec.model_source.claim} if spec.model_source.kind is SourceKind.PVC else set())
    )
    for claim in claims:
        volumes.append(
            {"name": f"pvc-{claim}", "persistentVolumeClaim": {"claimName": claim, "readOnly": True}}
        )
        mounts.append({"name": f"pvc-{claim}", "mountPath": f"{PVC_DIR}/{claim}", "readOnly": True})
    init_containers: list[Obj] = []
    s3_adapters = [a for a in adapters if a.source.kind is SourceKind.S3]
    if s3_adapters:
        volumes.append({"name": "adapters", "emptyDir": {}})
        mounts.append({"name": "adapters", "mountPath": S3_DIR})
        for adapter in s3_adapters:
            init_containers.append(
                {
                    "name": f"fetch-{adapter.name}"[:63].rstrip("-."),
                    "image": settings.s3_fetch_image,
                    "args": ["s3", "cp", "--recursive", adapter.source.location, pod_path(adapter)],
                    "env": _secret_env((adapter,), {SourceKind.S3}),
                    "volumeMounts": [{"name": "adapters", "mountPath": S3_DIR}],
                }
            )
    labels = child_labels(owner, "model-server")
    container: Obj = {
        "name": "vllm",
        "image": spec.image or settings.vllm_image,
        "args": args,
        "env": env,
        "ports": [{"name": "http", "containerPort": settings.model_port, "protocol": "TCP"}],
        "readinessProbe": {"httpGet": {"path": "/health", "port": settings.model_port}, "periodSeconds": 5},
        "volumeMounts": mounts,
    }
    containers = [container]
    if settings.sidecar_port:
        containers.append(
            {
                "name": "adapter-state",
                "image": settings.epp_image,
                "args": [
                    "sidecar",
                    f"--model-server=http://127.0.0.1:{settings.model_port}",
                    f"--port={settings.sidecar_port}",
                ],
                "ports": [
                    {"name": "grpc-adapters", "containerPort": settings.sidecar_port, "protocol": "TCP"}
                ],
                "resources": {"requests": {"cpu": "10m", "memory": "64Mi"}, "limits": {"memory": "128Mi"}},
            }
        )
    pod_spec: Obj = {"containers": containers, "volumes": volumes}
    if init_containers:
        pod_spec["initContainers"] = init_containers
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _meta(owner, owner.name, "model-server"),
        "spec": {
            "replicas": spec.replicas,
            "selector": {"matchLabels": {SERVICE_LABEL: owner.name, COMPONENT_LABEL: "model-server"}},
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1}},
            "template": {"metadata": {"labels": labels}, "spec": pod_spec},
        },
    }


def model_server_service(owner: Owner, settings: RenderSettings) -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _meta(owner, owner.name, "model-server"),
        "spec": {
            "selector": {SERVICE_LABEL: owner.name, COMPONENT_LABEL: "model-server"},
            "ports": [{"name": "http", "port": settings.model_port, "targetPort": settings.model_port}],
        },
    }


def epp_name(owner: Owner) -> str:
    return f"{owner.name}-epp"


def inference_pool(owner: Owner, settings: RenderSettings) -> Obj:
    return {
        "apiVersion": POOL_API_VERSION,
        "kind": "InferencePool",
        "metadata": _meta(owner, owner.name, "pool"),
        "spec": {
            "selector": {"matchLabels": {SERVICE_LABEL: owner.name, COMPONENT_LABEL: "model-server"}},
            "targetPorts": [{"number": settings.model_port}],
            "endpointPickerRef": {"name": epp_name(owner), "port": {"number": settings.epp_port}},
        },
    }


def model_object_name(owner: Owner, model: str) -> str:
    return f"{owner.name}-{model}"[:253]


def inference_models(owner: Owner, spec: ServiceSpec) -> list[Obj]:
    names = [spec.model, *(a.name for a in spec.adapters.items)]
    return [
        {
            "apiVersion": MODEL_API_VERSION,
            "kind": "InferenceModel",
            "metadata": _meta(owner, model_object_name(owner, name), "model"),
            "spec": {
                "modelName": name,
                "criticality": "Standard",
                "poolRef": {
                    "group": "inference.networking.k8s.io",
                    "kind": "InferencePool",
                    "name": owner.name,
                },
            },
        }
        for name in names
    ]


def epp_config_map(owner: Owner, spec: ServiceSpec) -> Obj:
    scheduler = weights_from_scoring_weights(spec.routing.scoring_weights)
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _meta(owner, epp_name(owner), "epp"),
        "data": {"scheduler.yaml": scheduler.to_yaml(), "adapters.yaml": catalog_for(spec).to_yaml()},
    }


def epp_rbac(owner: Owner) -> list[Obj]:
    """The chart's ServiceAccount, Role and RoleBinding for the EPP (charts/inferencepool,
    templates/epp-rbac.yaml) with the controller's names, labels and owner. The Role is the
    chart's whole: the lease rule too, which only leader election uses, so that the EPP's rights
    are one list wherever it runs; the binding names the account without a namespace, which for
    a RoleBinding means its own."""
    name = epp_name(owner)
    read = ["list", "watch"]
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": _meta(owner, name, "epp")},
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": _meta(owner, name, "epp"),
            "rules": [
                {
                    "apiGroups": ["inference.networking.k8s.io"],
                    "resources": ["inferencepools"],
                    "verbs": read,
                },
                {
                    "apiGroups": ["inference.networking.x-k8s.io"],
                    "resources": ["inferencepools", "inferencemodels", "inferenceobjectives"],
                    "verbs": read,
                },
                {
                    "apiGroups": ["inference.networking.x-k8s.io"],
                    "resources": ["inferencemodels/status"],
                    "verbs": ["patch"],
                },
                {"apiGroups": [""], "resources": ["pods"], "verbs": read},
                {"apiGroups": [""], "resources": ["events"], "verbs": ["create"]},
                {
                    "apiGroups": ["coordination.k8s.io"],
                    "resources": ["leases"],
                    "verbs": ["get", "create", "update"],
                },
            ],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": _meta(owner, name, "epp"),
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
            "subjects": [{"kind": "ServiceAccount", "name": name}],
        },
    ]


def epp_deployment(owner: Owner, settings: RenderSettings) -> Obj:
    """The chart's EPP Deployment (charts/inferencepool, one replica, the ConfigMap's
    scheduler.yaml as its config file) with the controller's own names, labels and owner, and
    a rollout that never drops the only replica. tests/deployment/test_chart.py renders the chart
    with the matching values and holds this to it field for field."""
    name = epp_name(owner)
    labels = child_labels(owner, "epp")
    args = [
        "serve",
        f"--pool-name={owner.name}",
        "--pool-namespace=$(POD_NAMESPACE)",
    ]
    if settings.epp_port != EPP_DEFAULT_PORT:
        args.append(f"--grpc-port={settings.epp_port}")
    args += [
        f"--config-file={CONFIG_DIR}/scheduler.yaml",
        f"--adapter-catalog={CONFIG_DIR}/adapters.yaml",
        f"--adapter-state-port={settings.sidecar_port}",
    ]
    container: Obj = {
        "name": "epp",
        "image": settings.epp_image,
        "imagePullPolicy": "IfNotPresent",
        "args": args,
        "env": [
            {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
            {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        ],
        "ports": [
            {"name": "grpc-ext-proc", "containerPort": settings.epp_port, "protocol": "TCP"},
            {"name": "grpc-health", "containerPort": EPP_HEALTH_PORT, "protocol": "TCP"},
            {"name": "http-metrics", "containerPort": EPP_METRICS_PORT, "protocol": "TCP"},
        ],
        "livenessProbe": {
            "grpc": {"port": EPP_HEALTH_PORT, "service": "liveness"},
            "initialDelaySeconds": 5,
            "periodSeconds": 10,
        },
        "readinessProbe": {
            "grpc": {"port": EPP_HEALTH_PORT, "service": "readiness"},
            "periodSeconds": 2,
            "failureThreshold": 2,
        },
        # Serving on while the gateway's endpoint discovery drops the leaving pod; the pod's
        # 30 s grace covers this pause, --drain-period and --grace-period.
        "lifecycle": {"preStop": {"sleep": {"seconds": 10}}},
        "resources": {"requests": {"cpu": "500m", "memory": "256Mi"}, "limits": {"memory": "1Gi"}},
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"]},
        },
        "volumeMounts": [
            {"name": "tmp", "mountPath": "/tmp"},
            {"name": "config", "mountPath": CONFIG_DIR, "readOnly": True},
        ],
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _meta(owner, name, "epp"),
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {SERVICE_LABEL: owner.name, COMPONENT_LABEL: "epp"}},
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1}},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "serviceAccountName": name,
                    "securityContext": {
                        "runAsNonRoot": True,
                        "runAsUser": 65532,
                        "runAsGroup": 65532,
                        "seccompProfile": {"type": "RuntimeDefault"},
                    },
                    "terminationGracePeriodSeconds": 30,
                    "containers": [container],
                    "volumes": [
                        {"name": "tmp", "emptyDir": {"sizeLimit": "64Mi"}},
                        {"name": "config", "configMap": {"name": name}},
                    ],
                },
            },
        },
    }


def epp_service(owner: Owner, settings: RenderSettings) -> Obj:
    """The chart's EPP Service (templates/epp-service.yaml): ext_proc for the gateway, gRPC health
    for gateways that health-check the EPP, metrics for Prometheus, each sent to the container
    port of the same name; the controller's names, labels, selector and owner."""
    ports = (
        ("grpc-ext-proc", settings.epp_port),
        ("grpc-health", EPP_HEALTH_PORT),
        ("http-metrics", EPP_METRICS_PORT),
    )
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _meta(owner, epp_name(owner), "epp"),
        "spec": {
            "selector": {SERVICE_LABEL: owner.name, COMPONENT_LABEL: "epp"},
            "ports": [
                {"name": name, "port": port, "targetPort": name, "protocol": "TCP"} for name, port in ports
            ],
        },
    }


def desired_objects(owner: Owner, spec: ServiceSpec, settings: RenderSettings) -> list[Obj]:
    """Every object this LLMInferenceService should own, in creation order."""
    objects = [
        epp_config_map(owner, spec),
        *epp_rbac(owner),
        model_server_deployment(owner, spec, settings),
        model_server_service(owner, settings),
        inference_pool(owner, settings),
        *inference_models(owner, spec),
        epp_deployment(owner, settings),
        epp_service(owner, settings),
    ]
    return [_without_none(o) for o in objects]


def _without_none(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: _without_none(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_without_none(v) for v in value]
    return value
