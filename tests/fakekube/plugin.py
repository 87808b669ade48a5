"""Pytest plugin: the `kube` fixture, a real Kubernetes API server for the tests that need one.

By default `kube` is the local control plane (`kind/local-cluster.sh`: etcd, kube-apiserver,
kube-controller-manager, kube-scheduler and kwok, built from their Go modules by
`kind/controlplane/install.sh`), started once per test process with our CRDs installed, and a
scratch namespace for each test; without the binaries those tests skip, naming the install
command. `--kube-real` uses the current kubeconfig's cluster instead. A test marked
`fake_kube` gets the fake API server (`tests/fakekube/server.py`): only for faults the real one
cannot be made to show on demand, each mark naming which.
"""

from __future__ import annotations

import os
import pathlib
import uuid
from collections.abc import Iterator, Mapping
from typing import Any, Protocol

import pytest

from testkit.localcluster import INSTALL, LocalCluster, kubectl_path, missing_binaries
from testkit.waiting import wait_until
from tests.fakekube.server import FakeKube

ROOT = pathlib.Path(__file__).resolve().parents[2]
CRDS = (
    ROOT / "manifests" / "crds",
    ROOT / "manifests" / "controller" / "inference.llm-d.ai_llminferenceservices.yaml",
)


FIELD_MANAGER = "epp-tests"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--kube-real",
        action="store_true",
        default=False,
        help="run the Kubernetes source tests against the current kubeconfig's cluster",
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "fake_kube(reason): this test needs the fake API server's fault injection (say which)"
    )


class KubeEnv(Protocol):
    """What the tests need of a cluster, fake or real."""

    kubeconfig: str
    namespace: str

    def put(self, obj: Mapping[str, Any]) -> dict[str, Any]: ...

    def delete(self, api_version: str, kind: str, namespace: str, name: str) -> bool: ...

    def get(self, api_version: str, kind: str, namespace: str, name: str) -> dict[str, Any] | None: ...

    def list(self, api_version: str, kind: str, namespace: str) -> list[dict[str, Any]]: ...

    @property
    def fake(self) -> FakeKube | None: ...


class FakeEnv:
    def __init__(self, server: FakeKube, kubeconfig: pathlib.Path, namespace: str) -> None:
        self._server = server
        self.kubeconfig = str(kubeconfig)
        self.namespace = namespace

    def put(self, obj: Mapping[str, Any]) -> dict[str, Any]:
        return self._server.put(obj)

    def delete(self, api_version: str, kind: str, namespace: str, name: str) -> bool:
        return self._server.delete(api_version, kind, namespace, name)

    def get(self, api_version: str, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        return self._server.get(api_version, kind, namespace, name)

    def list(self, api_version: str, kind: str, namespace: str) -> list[dict[str, Any]]:
        return self._server.list(api_version, kind, namespace)

    @property
    def fake(self) -> FakeKube | None:
        return self._server


class RealEnv:
    """The same operations against a real API server, with the dynamic client."""

    def __init__(self, kubeconfig: str, namespace: str) -> None:
        from kubernetes import config, dynamic

        self.kubeconfig = kubeconfig
        self.namespace = namespace
        self._client = dynamic.DynamicClient(  # type: ignore[no-untyped-call]  # untyped upstream
            config.new_client_from_config(config_file=kubeconfig)  # type: ignore[no-untyped-call]
        )

    def _api(self, api_version: str, kind: str) -> Any:
        return self._client.resources.get(api_version=api_version, kind=kind)

    def put(self, obj: Mapping[str, Any]) -> dict[str, Any]:
        """Create or update `obj` by server-side apply (the API server keeps the fields it
        defaulted, which a replace would try to take away, e.g. from a Pod's spec), then merge
        its status, if it has one, through the status subresource."""
        api = self._api(obj["apiVersion"], obj["kind"])
        meta = obj["metadata"]
        namespace = meta.get("namespace", self.namespace)
        body = {key: value for key, value in obj.items() if key != "status"}
        # What an object read back carries that an apply must not: the server's field ownership,
        # and the resourceVersion that would make the apply fail if anything wrote in between
        # (a running controller's status, say). An apply states what the test wants, as kubectl's.
        server_owned = ("managedFields", "resourceVersion")
        body["metadata"] = {k: v for k, v in meta.items() if k not in server_owned} | {"namespace": namespace}
        result = api.server_side_apply(
            body=body,
            name=meta["name"],
            namespace=namespace,
            field_manager=FIELD_MANAGER,
            force_conflicts=True,
        )
        if "status" in obj:
            result = api.status.patch(
                body={"status": obj["status"]},
                name=meta["name"],
                namespace=namespace,
                content_type="application/merge-patch+json",
            )
        return dict(result.to_dict())

    def delete(self, api_version: str, kind: str, namespace: str, name: str) -> bool:
        from kubernetes.client.exceptions import ApiException

        try:
            self._api(api_version, kind).delete(name=name, namespace=namespace, grace_period_seconds=0)
        except ApiException as error:
            if error.status == 404:
                return False
            raise
        return True

    def get(self, api_version: str, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        from kubernetes.client.exceptions import ApiException

        try:
            return dict(self._api(api_version, kind).get(name=name, namespace=namespace).to_dict())
        except ApiException as error:
            if error.status == 404:
                return None
            raise

    def list(self, api_version: str, kind: str, namespace: str) -> list[dict[str, Any]]:
        items = self._api(api_version, kind).get(namespace=namespace).items
        return [dict(item.to_dict()) for item in items]

    @property
    def fake(self) -> FakeKube | None:
        return None


@pytest.fixture(scope="session")
def local_control_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """The local control plane, with the CRDs of `manifests/` established."""
    missing = missing_binaries()
    if missing:
        pytest.skip(f"control plane not built ({', '.join(missing)}): run {INSTALL}")
    kubectl = kubectl_path()
    if kubectl is None:
        pytest.skip("kubectl not found: run bash .ci/k8s_tools.sh")
    cluster = LocalCluster.start(tmp_path_factory.mktemp("control-plane"), kubectl)
    try:
        for crds in CRDS:
            cluster.kubectl("apply", "--server-side", "-f", str(crds))
        cluster.kubectl("wait", "--for=condition=Established", "crd", "--all", "--timeout=60s")
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def kube(request: pytest.FixtureRequest, tmp_path: pathlib.Path) -> Iterator[KubeEnv]:
    if request.node.get_closest_marker("fake_kube") is not None:
        server = FakeKube()
        server.start()
        try:
            namespace = "epp-test"
            yield FakeEnv(server, server.write_kubeconfig(tmp_path / "kubeconfig", namespace), namespace)
        finally:
            server.stop()
        return
    if request.config.getoption("--kube-real"):
        yield from _real_env()
        return
    cluster: LocalCluster = request.getfixturevalue("local_control_plane")
    yield from _real_env(str(cluster.kubeconfig))


def _real_env(kubeconfig: str | None = None) -> Iterator[KubeEnv]:
    """A scratch namespace on the cluster of `kubeconfig` (default: the current one), deleted after."""
    from kubernetes import client, config
    from kubernetes.config.config_exception import ConfigException
    from urllib3.exceptions import HTTPError

    if kubeconfig is None:
        kubeconfig = os.path.expanduser(os.environ.get("KUBECONFIG", "~/.kube/config").split(os.pathsep)[0])
    try:
        api = client.CoreV1Api(config.new_client_from_config(config_file=kubeconfig))  # type: ignore[no-untyped-call]
        namespace = f"epp-test-{uuid.uuid4().hex[:6]}"
        # No node matches this namespace's Pods (the PodNodeSelector admission plugin): they stay
        # Pending, as on a cluster without capacity, so what a test makes never starts running.
        annotations = {"scheduler.alpha.kubernetes.io/node-selector": "lora-epp.test/no-node=true"}
        api.create_namespace(
            client.V1Namespace(metadata=client.V1ObjectMeta(name=namespace, annotations=annotations)),
            _request_timeout=5,
        )
    except (ConfigException, OSError, HTTPError, client.exceptions.ApiException) as error:
        pytest.skip(f"no reachable cluster in {kubeconfig} ({error})")
    try:
        # The API server refuses Pods in a namespace until the controller manager has made its
        # default ServiceAccount; on a busy machine that takes a moment after the namespace.
        wait_until(
            lambda: bool(api.list_namespaced_service_account(namespace, _request_timeout=5).items),
            f"the default ServiceAccount of {namespace}",
            within_s=60,
        )
        yield RealEnv(kubeconfig, namespace)
    finally:
        api.delete_namespace(namespace, _request_timeout=5)


def needs_fake(env: KubeEnv) -> FakeKube:
    """The fake server of a test marked `fake_kube`."""
    if env.fake is None:
        pytest.skip("fault injection needs the fake API server (mark the test fake_kube)")
    return env.fake
