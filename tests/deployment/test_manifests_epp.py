"""manifests/epp (rendered from the chart by manifests/render.sh): every object validates
against the Kubernetes OpenAPI schemas, and the Role grants exactly the (apiGroup, resource,
verb) calls the code makes, no more and no less."""

from __future__ import annotations

import copy
import pathlib
from typing import Any

import kubernetes_validate
import pytest
import yaml

from epp.kube import leader
from epp.kube import watch as kube

ROOT = pathlib.Path(__file__).resolve().parents[2]
EPP_DIR = ROOT / "manifests" / "epp"
KUBERNETES_VERSION = "1.30.0"
KUSTOMIZATION = "kustomization.yaml"
VALUES = "values.yaml"  # what the directory is rendered from, not an object

OBJECT_FILES = sorted(p for p in EPP_DIR.glob("*.yaml") if p.name not in (KUSTOMIZATION, VALUES))
OBJECTS = [
    (path.name, doc)
    for path in OBJECT_FILES
    for doc in yaml.safe_load_all(path.read_text())
    if doc is not None
]


def _one(kind: str) -> dict[str, Any]:
    found = [doc for _, doc in OBJECTS if doc["kind"] == kind]
    assert len(found) == 1, f"expected one {kind} in manifests/epp, found {len(found)}"
    obj: dict[str, Any] = found[0]
    return obj


def _granted(role: dict[str, Any]) -> set[tuple[str, str, str]]:
    return {
        (group, resource, verb)
        for rule in role["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }


@pytest.mark.parametrize(("name", "obj"), OBJECTS, ids=[f"{name}:{doc['kind']}" for name, doc in OBJECTS])
def test_object_validates_against_kubernetes_schema(name: str, obj: dict[str, Any]) -> None:
    kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)


def test_validation_catches_a_bad_field() -> None:
    deployment = copy.deepcopy(_one("Deployment"))
    deployment["spec"]["template"]["spec"]["containers"][0]["ports"][0]["containerPort"] = "grpc"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, KUBERNETES_VERSION, strict=True)


def test_kustomization_lists_every_manifest() -> None:
    kustomization = yaml.safe_load((EPP_DIR / KUSTOMIZATION).read_text())
    assert sorted(kustomization["resources"]) == sorted(p.name for p in OBJECT_FILES)


def test_role_grants_exactly_the_calls_the_code_makes() -> None:
    used = kube.API_CALLS | leader.API_CALLS
    granted = _granted(_one("Role"))
    assert granted - used == set(), "granted but never used"
    assert used - granted == set(), "used but not granted"


def test_role_binding_binds_the_deployment_service_account() -> None:
    account = _one("ServiceAccount")["metadata"]["name"]
    binding = _one("RoleBinding")
    assert binding["roleRef"]["name"] == _one("Role")["metadata"]["name"]
    assert {"kind": "ServiceAccount", "name": account} in binding["subjects"]
    assert _one("Deployment")["spec"]["template"]["spec"]["serviceAccountName"] == account


@pytest.mark.parametrize(
    ("port_name", "number"),
    [("grpc-ext-proc", 9002), ("grpc-health", 9003), ("http-metrics", 9090)],
    ids=["ext-proc", "health", "metrics"],
)
def test_deployment_exposes_port(port_name: str, number: int) -> None:
    container = _one("Deployment")["spec"]["template"]["spec"]["containers"][0]
    assert {"name": port_name, "containerPort": number, "protocol": "TCP"} in container["ports"]


def test_deployment_is_hardened_and_probed_over_grpc() -> None:
    pod = _one("Deployment")["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    assert container["resources"]["requests"] and container["resources"]["limits"]
    assert container["livenessProbe"]["grpc"] == {"port": 9003, "service": "liveness"}
    assert container["readinessProbe"]["grpc"] == {"port": 9003, "service": "readiness"}
    assert container["args"][:2] == ["serve", "--pool-name=vllm-llama3-8b"]


def test_service_selects_the_deployment_pods() -> None:
    service = _one("Service")
    labels = _one("Deployment")["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= labels.items()
    assert {p["port"] for p in service["spec"]["ports"]} == {9002, 9003, 9090}
