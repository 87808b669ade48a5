"""The fake API server collects dependents through ownerReferences as the real garbage
collector does (background by default, Orphan and Foreground on request), over real HTTP."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest
from kubernetes import client

from epp.kube.api import KubeApi, ResourceRef, load_api_client
from tests.fakekube.plugin import KubeEnv, needs_fake
from tests.fakekube.server import FakeKube

pytestmark = [
    pytest.mark.integration,
    pytest.mark.timeout(60),
    pytest.mark.fake_kube(reason="checks the fake's own garbage collector"),
]

CONFIG_MAP = ResourceRef("v1", "ConfigMap")


@pytest.fixture
def fake(kube: KubeEnv) -> FakeKube:
    return needs_fake(kube)


def _config_map(name: str, namespace: str, *owners: dict[str, Any]) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": namespace}
    if owners:
        meta["ownerReferences"] = [
            {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "name": o["metadata"]["name"],
                "uid": o["metadata"]["uid"],
                "controller": i == 0,
                "blockOwnerDeletion": True,
            }
            for i, o in enumerate(owners)
        ]
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": {}}


def _names(fake: FakeKube, namespace: str) -> set[str]:
    return {o["metadata"]["name"] for o in fake.list("v1", "ConfigMap", namespace)}


def _wait_for(predicate: Callable[[], bool], what: str, within_s: float = 10.0) -> None:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.02)
    raise AssertionError(f"{what}: not within {within_s}s")


def test_background_deletion_cascades_and_spares_dependents_with_a_live_owner(
    fake: FakeKube, kube: KubeEnv
) -> None:
    ns = kube.namespace
    owner = fake.put(_config_map("owner", ns))
    other = fake.put(_config_map("other-owner", ns))
    child = fake.put(_config_map("child", ns, owner))
    fake.put(_config_map("grandchild", ns, child))
    fake.put(_config_map("shared", ns, owner, other))
    fake.put(_config_map("unrelated", ns))
    assert fake.delete("v1", "ConfigMap", ns, "owner")
    _wait_for(lambda: _names(fake, ns) == {"other-owner", "shared", "unrelated"}, "dependents collected")
    shared = fake.get("v1", "ConfigMap", ns, "shared")
    assert shared is not None
    assert [r["name"] for r in shared["metadata"]["ownerReferences"]] == ["other-owner"]


def test_orphan_deletion_over_http_keeps_dependents_without_the_reference(
    fake: FakeKube, kube: KubeEnv
) -> None:
    ns = kube.namespace
    owner = fake.put(_config_map("owner", ns))
    fake.put(_config_map("child", ns, owner))
    core = client.CoreV1Api(load_api_client(kube.kubeconfig))
    core.delete_namespaced_config_map("owner", ns, body=client.V1DeleteOptions(propagation_policy="Orphan"))
    _wait_for(lambda: _names(fake, ns) == {"child"}, "owner gone")
    child = fake.get("v1", "ConfigMap", ns, "child")
    assert child is not None and "ownerReferences" not in child["metadata"]


def test_foreground_deletion_removes_dependents_before_the_owner(fake: FakeKube, kube: KubeEnv) -> None:
    ns = kube.namespace
    owner = fake.put(_config_map("owner", ns))
    fake.put(_config_map("child", ns, owner))
    since = fake.resource_version
    core = client.CoreV1Api(load_api_client(kube.kubeconfig))
    core.delete_namespaced_config_map(
        "owner", ns, body=client.V1DeleteOptions(propagation_policy="Foreground")
    )
    _wait_for(lambda: not _names(fake, ns), "owner and child gone")
    api = KubeApi(load_api_client(kube.kubeconfig))
    events = []
    for event_type, obj in api.watch(CONFIG_MAP, ns, since, timeout_s=1):
        events.append((event_type, obj["metadata"]["name"], obj["metadata"].get("finalizers")))
        if len(events) == 3:
            break
    assert events == [
        ("MODIFIED", "owner", ["foregroundDeletion"]),
        ("DELETED", "child", None),
        ("DELETED", "owner", ["foregroundDeletion"]),
    ]
