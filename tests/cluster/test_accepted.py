"""What a user applies, accepted by a real API server's validation (server-side dry run): the
CRDs, every sample, every kustomization under `manifests/` and `e2e/manifests/`, the chart's
render for every gateway provider, and the LLMInferenceService sample; and `kubectl get` shows
the CRDs' printer columns.

Kinds the local control plane does not serve (the gateways' own CRDs: Gateway API, Istio,
kgateway, Envoy Gateway, Prometheus Operator) are left out, and the test names each one left
out, so a kind of ours cannot be skipped by accident.
"""

from __future__ import annotations

import json
import pathlib
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from testkit.localcluster import LocalCluster, dump
from tests.deployment.tools import find

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(300)]

ROOT = pathlib.Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "inferencepool"
KIND_VALUES = ROOT / "kind" / "values.yaml"
PROVIDERS = ("none", "istio", "kgateway", "envoy-gateway")
KUSTOMIZATIONS = sorted(
    str(path.parent.relative_to(ROOT))
    for pattern in ("manifests/**/kustomization.yaml", "e2e/manifests/**/kustomization.yaml")
    for path in ROOT.glob(pattern)
)
SAMPLES = ("manifests/samples", "manifests/controller/samples")
# Served by the gateway implementations, none of which this control plane runs.
THIRD_PARTY_GROUPS = {
    "gateway.networking.k8s.io",
    "networking.istio.io",
    "telemetry.istio.io",
    "gateway.kgateway.dev",
    "gateway.envoyproxy.io",
    "monitoring.coreos.com",
}


def documents(text: str) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(text) if doc]


def group_of(obj: dict[str, Any]) -> str:
    api_version: str = obj["apiVersion"]
    return api_version.rpartition("/")[0]


def dry_run(cluster: LocalCluster, objects: list[dict[str, Any]], namespace: str) -> list[str]:
    """Server-side dry run of the objects this API server serves; returns the third-party kinds
    left out. Fails with the API server's own message for anything it rejects."""
    known_groups = {group for group, _ in _resource_groups(cluster)}
    ours = [o for o in objects if group_of(o) in known_groups]
    left_out = sorted({f"{o['kind']}.{group_of(o)}" for o in objects if group_of(o) not in known_groups})
    assert {name.split(".", 1)[1] for name in left_out} <= THIRD_PARTY_GROUPS, left_out
    if ours:
        result = cluster.kubectl(
            "apply", "--dry-run=server", "-n", namespace, "-f", "-", stdin=dump(ours), check=False
        )
        assert result.returncode == 0, result.stderr
    return left_out


def _resource_groups(cluster: LocalCluster) -> set[tuple[str, str]]:
    groups: set[tuple[str, str]] = set()
    for line in cluster.kubectl("api-versions").stdout.split():
        group, _, version = line.rpartition("/")
        groups.add((group, version))
    return groups


@pytest.fixture(scope="module")
def namespace(cluster: LocalCluster) -> Iterator[str]:
    name = "accepted"
    cluster.kubectl("create", "namespace", name)
    yield name
    cluster.kubectl("delete", "namespace", name, "--wait=false")


def test_the_crds_are_established_with_the_versions_they_declare(cluster: LocalCluster) -> None:
    crds = {item["metadata"]["name"]: item for item in cluster.get("crd")["items"]}
    for path in sorted((ROOT / "manifests" / "crds").glob("*.yaml")):
        (declared,) = documents(path.read_text())
        name = declared["metadata"]["name"]
        served = crds[name]
        established = {c["type"]: c["status"] for c in served["status"]["conditions"]}
        assert established.get("Established") == "True", name
        assert [v["name"] for v in served["spec"]["versions"]] == [
            v["name"] for v in declared["spec"]["versions"]
        ]


@pytest.mark.parametrize("directory", SAMPLES)
def test_every_sample_is_accepted(cluster: LocalCluster, namespace: str, directory: str) -> None:
    objects = [
        doc for path in sorted((ROOT / directory).glob("*.yaml")) for doc in documents(path.read_text())
    ]
    assert objects
    assert dry_run(cluster, objects, namespace) == []


@pytest.mark.parametrize("directory", KUSTOMIZATIONS)
def test_every_kustomization_is_accepted(cluster: LocalCluster, namespace: str, directory: str) -> None:
    rendered = cluster.kubectl("kustomize", str(ROOT / directory)).stdout
    objects = documents(rendered)
    assert objects
    dry_run(cluster, objects, namespace)


@pytest.mark.parametrize("provider", PROVIDERS)
def test_the_chart_render_is_accepted(cluster: LocalCluster, namespace: str, provider: str) -> None:
    helm = find("helm")
    if helm is None:
        pytest.skip("helm not found: run bash .ci/k8s_tools.sh")
    values: dict[str, Any] = yaml.safe_load(KIND_VALUES.read_text())
    routes = provider != "none"
    values |= {
        "provider": {"name": provider},
        "gateway": {"create": routes},
        "httpRoute": {"enabled": routes},
    }
    result = subprocess.run(
        [helm, "template", "accepted", str(CHART), "--namespace", namespace, "--values", "-"],
        input=json.dumps(values),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    left_out = dry_run(cluster, documents(result.stdout), namespace)
    if provider == "none":
        assert left_out == []


def test_kubectl_get_shows_the_printer_columns(cluster: LocalCluster, namespace: str) -> None:
    samples = ROOT / "manifests" / "samples"
    cluster.apply(
        dump([doc for p in sorted(samples.glob("*.yaml")) for doc in documents(p.read_text())]),
        "-n",
        namespace,
    )
    checked = []
    for path in sorted((ROOT / "manifests" / "crds").glob("*.yaml")):
        (crd,) = documents(path.read_text())
        columns = [
            c["name"].upper()
            for version in crd["spec"]["versions"]
            if version.get("storage")
            for c in version.get("additionalPrinterColumns", [])
        ]
        resource = f"{crd['spec']['names']['plural']}.{crd['spec']['group']}"
        lines = cluster.kubectl("get", resource, "-n", namespace).stdout.splitlines()
        if columns and lines:  # a kind with columns and a sample object of it
            assert all(column in lines[0] for column in columns), (resource, lines[0], columns)
            checked.append(resource)
    assert checked, "no sample object of a kind with printer columns"


REFUSED = [
    (
        {
            "apiVersion": "inference.networking.x-k8s.io/v1alpha2",
            "kind": "InferenceModel",
            "metadata": {"name": "chat"},
            "spec": {
                "modelName": "llama",
                "poolRef": {"name": "p"},
                "targetModels": [{"name": "a", "weight": 10}, {"name": "b"}],
            },
        },
        "weights must be set on all targetModels or on none",
    ),
    (
        {
            "apiVersion": "inference.networking.k8s.io/v1",
            "kind": "InferencePool",
            "metadata": {"name": "p"},
            "spec": {
                "selector": {"matchLabels": {"app": "vllm"}},
                "targetPorts": [{"number": 70000}],
                "endpointPickerRef": {"name": "epp", "port": {"number": 9002}},
            },
        },
        "should be less than or equal to 65535",
    ),
    (
        {
            "apiVersion": "inference.llm-d.ai/v1alpha1",
            "kind": "LLMInferenceService",
            "metadata": {"name": "s"},
            "spec": {"model": "m", "routing": {"scoringWeights": {"load": 0}}},
        },
        "at least one scoring weight must be positive",
    ),
]


@pytest.mark.parametrize(("obj", "message"), REFUSED, ids=["model-weights", "pool-port", "zero-weights"])
def test_a_bad_object_is_refused_at_admission_with_a_clear_message(
    cluster: LocalCluster, namespace: str, obj: dict[str, Any], message: str
) -> None:
    result = cluster.kubectl(
        "apply", "--dry-run=server", "-n", namespace, "-f", "-", stdin=dump([obj]), check=False
    )
    assert result.returncode != 0 and message in result.stderr, result.stderr
