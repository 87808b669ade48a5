"""Every manifest we ship: workloads run non-root on a read-only root filesystem with no extra
privileges, RBAC is namespaced and least-privilege, and the Envoy config strips client-sent
destination headers before the EPP sees the request."""

from __future__ import annotations

import pathlib
from typing import Any

import pytest
import yaml

from epp.picker import wire

ROOT = pathlib.Path(__file__).resolve().parents[2]
MANIFESTS = ROOT / "manifests"
WORKLOAD_KINDS = {"Deployment", "StatefulSet", "DaemonSet", "Job", "Pod"}
# The real vLLM server writes its compile and model caches under its root filesystem and its image
# runs as root; it is the model server, not part of lora-epp. Everything else must be hardened.
THIRD_PARTY_WORKLOADS = {("manifests/vllm/deployment.yaml", "vllm")}
FORBIDDEN_VERBS = {"*", "escalate", "bind", "impersonate"}


def all_documents() -> list[tuple[str, dict[str, Any]]]:
    docs = []
    for path in sorted(MANIFESTS.rglob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if isinstance(doc, dict):
                docs.append((str(path.relative_to(ROOT)), doc))
    return docs


def documents() -> list[tuple[str, dict[str, Any]]]:
    """Kubernetes objects only."""
    return [(path, doc) for path, doc in all_documents() if "kind" in doc]


def containers() -> list[tuple[str, dict[str, Any], dict[str, Any]]]:
    found = []
    for path, doc in documents():
        if doc["kind"] not in WORKLOAD_KINDS:
            continue
        pod = doc["spec"] if doc["kind"] == "Pod" else doc["spec"]["template"]["spec"]
        for container in pod.get("containers", []) + pod.get("initContainers", []):
            if (path, container["name"]) not in THIRD_PARTY_WORKLOADS:
                found.append((f"{path}:{container['name']}", pod, container))
    return found


CONTAINERS = containers()


def test_there_are_workloads_to_check() -> None:
    assert len(CONTAINERS) >= 3


@pytest.mark.parametrize(("name", "pod", "container"), CONTAINERS, ids=[c[0] for c in CONTAINERS])
def test_containers_are_hardened(name: str, pod: dict[str, Any], container: dict[str, Any]) -> None:
    pod_context = pod.get("securityContext", {})
    context = container.get("securityContext", {})
    assert context.get("runAsNonRoot", pod_context.get("runAsNonRoot")) is True
    assert context.get("readOnlyRootFilesystem") is True
    assert context.get("allowPrivilegeEscalation") is False
    assert "ALL" in context.get("capabilities", {}).get("drop", [])
    assert context.get("privileged") is not True


RULES = [
    (f"{path}:{doc['metadata']['name']}", doc["kind"], rule)
    for path, doc in documents()
    if doc["kind"] in ("Role", "ClusterRole")
    for rule in doc.get("rules", [])
]


def test_there_is_rbac_to_check() -> None:
    assert RULES


@pytest.mark.parametrize(("name", "kind", "rule"), RULES, ids=[f"{r[0]}#{i}" for i, r in enumerate(RULES)])
def test_rbac_is_namespaced_and_least_privilege(name: str, kind: str, rule: dict[str, Any]) -> None:
    assert kind == "Role", "cluster-wide roles are not needed"
    assert "*" not in rule.get("apiGroups", []) and "*" not in rule.get("resources", [])
    assert not FORBIDDEN_VERBS & set(rule.get("verbs", []))
    assert "secrets" not in rule.get("resources", [])
    assert "nonResourceURLs" not in rule


def envoy_listener_filters() -> list[list[dict[str, Any]]]:
    chains = []
    for _path, doc in all_documents():
        if "static_resources" not in doc:
            continue
        for listener in doc["static_resources"].get("listeners", []):
            for chain in listener.get("filter_chains", []):
                for network_filter in chain.get("filters", []):
                    config = network_filter.get("typed_config", {})
                    if "http_filters" in config:
                        chains.append(config["http_filters"])
    return chains


def test_shipped_envoy_configs_strip_client_destination_headers_before_the_epp() -> None:
    chains = envoy_listener_filters()
    assert chains, "no Envoy bootstrap found under manifests/"
    with_ext_proc = [f for f in chains if "envoy.filters.http.ext_proc" in [x["name"] for x in f]]
    assert with_ext_proc, "no Envoy config with ext_proc under manifests/"
    for filters in with_ext_proc:
        names = [f["name"] for f in filters]
        mutation = names.index("envoy.filters.http.header_mutation")
        assert mutation < names.index("envoy.filters.http.ext_proc")
        removed = {
            m["remove"]
            for m in filters[mutation]["typed_config"]["mutations"]["request_mutations"]
            if "remove" in m
        }
        assert removed >= wire.STRIPPED_CLIENT_HEADERS
