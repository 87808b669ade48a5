"""Offline checks of Kubernetes objects, shared by the manifest and chart tests: built-in kinds
against the Kubernetes OpenAPI schemas (kubernetes-validate), our kinds against our CRDs' schemas
and the EPP's own parser, and third-party kinds (Gateway API, Istio, Prometheus Operator) for
the fields their implementations require. Also where the real `helm` and `kubectl` are found."""

from __future__ import annotations

import functools
import pathlib
import shutil
from collections.abc import Iterable, Mapping
from typing import Any

import jsonschema  # type: ignore[import-untyped]  # no stubs installed
import kubernetes_validate
import yaml

from epp.picker.sources.objects import parse_object

ROOT = pathlib.Path(__file__).resolve().parents[2]
KUBERNETES_VERSION = "1.30.0"
CRD_DIR = ROOT / "manifests" / "crds"
# Where .ci/k8s_tools.sh puts the helm and kubectl it unpacks; preferred over PATH so that every
# machine runs the same versions.
TOOLS_DIR = ROOT / ".tools" / "bin"

# Fields each implementation rejects an object without (Gateway API, Istio, kgateway, Envoy
# Gateway and Prometheus Operator schemas; none of their CRDs is vendored here).
REQUIRED_FIELDS: dict[str, list[str]] = {
    "GatewayClass": ["metadata.name", "spec.controllerName"],
    "Gateway": ["metadata.name", "spec.gatewayClassName", "spec.listeners"],
    "HTTPRoute": ["metadata.name", "spec.parentRefs", "spec.rules"],
    "DestinationRule": ["metadata.name", "spec.host"],
    "ServiceMonitor": ["metadata.name", "spec.selector", "spec.endpoints"],
    # The gateways' access logs to the EPP (tests/support/gateway_access_log.py checks what they name).
    "HTTPListenerPolicy": ["metadata.name", "spec.targetRefs", "spec.accessLog"],
    "BackendConfigPolicy": ["metadata.name", "spec.targetRefs"],
    "Telemetry": ["metadata.name", "spec.accessLogging"],
    "EnvoyProxy": ["metadata.name", "spec"],
    "Backend": ["metadata.name", "spec.endpoints"],
}
THIRD_PARTY_GROUPS = {
    "gateway.networking.k8s.io",
    "networking.istio.io",
    "gateway.envoyproxy.io",
    "gateway.kgateway.dev",
    "telemetry.istio.io",
    "monitoring.coreos.com",
}


def kube_tool(name: str) -> str | None:
    """helm or kubectl: the one .ci/k8s_tools.sh installed, else the one on PATH, else None."""
    pinned = TOOLS_DIR / name
    return str(pinned) if pinned.is_file() else shutil.which(name)


def group(obj: Mapping[str, Any]) -> str:
    api_version = str(obj.get("apiVersion", ""))
    return api_version.rpartition("/")[0] if "/" in api_version else ""


def get(obj: Mapping[str, Any], dotted: str) -> Any:
    value: Any = obj
    for key in dotted.split("."):
        value = value.get(key) if isinstance(value, Mapping) else None
    return value


Schemas = Mapping[tuple[str, str], Mapping[str, Any]]


def schemas_of(objects: Iterable[Mapping[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    """(apiVersion, kind) → openAPIV3Schema of every CustomResourceDefinition among objects."""
    schemas = {}
    for crd in objects:
        if crd.get("kind") != "CustomResourceDefinition":
            continue
        for version in crd["spec"]["versions"]:
            key = (f"{crd['spec']['group']}/{version['name']}", crd["spec"]["names"]["kind"])
            schemas[key] = version["schema"]["openAPIV3Schema"]
    return schemas


@functools.cache
def crd_schemas() -> dict[tuple[str, str], dict[str, Any]]:
    """The schemas of our CRDs, the ones in manifests/crds."""
    return schemas_of(
        doc for path in sorted(CRD_DIR.glob("*.yaml")) for doc in yaml.safe_load_all(path.read_text()) if doc
    )


def is_ours(obj: Mapping[str, Any], schemas: Schemas | None = None) -> bool:
    """A kind one of our CRDs defines (those of manifests/crds unless `schemas` says otherwise)."""
    return (obj.get("apiVersion"), obj.get("kind")) in (crd_schemas() if schemas is None else schemas)


def ours_errors(obj: Mapping[str, Any], schemas: Schemas | None = None) -> list[str]:
    """Our CRD's schema errors for obj; an object that passes must also pass the EPP's parser."""
    schema = (crd_schemas() if schemas is None else schemas)[(obj["apiVersion"], obj["kind"])]
    errors = [str(e.message) for e in jsonschema.Draft7Validator(schema).iter_errors(obj)]
    if not errors and obj["kind"] in ("InferencePool", "InferenceModel", "InferenceObjective"):
        parsed = parse_object(dict(obj), default_namespace="default", strict=True)
        if parsed.name != obj["metadata"]["name"]:
            errors.append(f"the EPP parsed {obj['metadata']['name']} as {parsed.name}")
    return errors


def third_party_errors(obj: Mapping[str, Any]) -> list[str]:
    kind = obj["kind"]
    if kind not in REQUIRED_FIELDS:
        return [f"no field table for {kind}; add one to tests/support/kube_objects.py"]
    errors = [f"{kind} needs {f}" for f in REQUIRED_FIELDS[kind] if get(obj, f) in (None, "", [], {})]
    if kind == "Gateway":
        for listener in obj["spec"]["listeners"]:
            if not {"name", "port", "protocol"} <= set(listener) or not 1 <= listener["port"] <= 65535:
                errors.append(f"bad listener {listener}")
    return errors


def validate(obj: dict[str, Any]) -> None:
    """Raise if obj would be rejected: by the API server's schema, our CRDs, or its implementation."""
    if is_ours(obj):
        errors = ours_errors(obj)
    elif group(obj) in THIRD_PARTY_GROUPS:
        errors = third_party_errors(obj)
    else:
        kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)
        errors = []
    if errors:
        raise AssertionError(f"{obj['kind']}/{obj['metadata']['name']}: {errors}")
