"""Pytest plugin: the `kube` fixture, a fake API server by default or a real cluster with `--kube-real`.

`--kube-real` uses the current kubeconfig and a scratch namespace (created, then deleted);
the CRDs from `manifests/crds/` must be installed. Tests that need fault injection the
real API server cannot do on demand (compacting history, dropping watches) skip there.
"""

from __future__ import annotations

import os
import pathlib
import uuid
from collections.abc import Iterator, Mapping
from typing import Any, Protocol

import pytest

from tests.fakekube.server import FakeKube


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--kube-real",
        action="store_true",
        default=False,
        help="run the Kubernetes source tests against the current kubeconfig's cluster",
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
        from kubernetes.client.exceptions import ApiException

        api = self._api(obj["apiVersion"], obj["kind"])
        meta = obj["metadata"]
        namespace = meta.get("namespace", self.namespace)
        body = dict(obj)
        try:
            current = api.get(name=meta["name"], namespace=namespace)
            body["metadata"] = {**meta, "resourceVersion": current.metadata.resourceVersion}
            result = api.replace(body=body, namespace=namespace)
        except ApiException as error:
            if error.status != 404:
                raise
            result = api.create(body=body, namespace=namespace)
        if "status" in obj:
            body = result.to_dict()
            body["status"] = obj["status"]
            result = api.status.replace(body=body, namespace=namespace)
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


@pytest.fixture
def kube(request: pytest.FixtureRequest, tmp_path: pathlib.Path) -> Iterator[KubeEnv]:
    if request.config.getoption("--kube-real"):
        yield from _real_env()
        return
    server = FakeKube()
    server.start()
    try:
        namespace = "epp-test"
        yield FakeEnv(server, server.write_kubeconfig(tmp_path / "kubeconfig", namespace), namespace)
    finally:
        server.stop()


def _real_env() -> Iterator[KubeEnv]:
    from kubernetes import client, config
    from kubernetes.config.config_exception import ConfigException
    from urllib3.exceptions import HTTPError

    try:
        api = client.CoreV1Api(config.new_client_from_config())  # type: ignore[no-untyped-call]  # untyped
        namespace = f"epp-test-{uuid.uuid4().hex[:6]}"
        api.create_namespace(
            client.V1Namespace(metadata=client.V1ObjectMeta(name=namespace)), _request_timeout=5
        )
    except (ConfigException, OSError, HTTPError, client.exceptions.ApiException) as error:
        pytest.skip(f"--kube-real: no reachable cluster in the current kubeconfig ({error})")
    try:
        kubeconfig = os.path.expanduser(os.environ.get("KUBECONFIG", "~/.kube/config").split(os.pathsep)[0])
        yield RealEnv(kubeconfig, namespace)
    finally:
        api.delete_namespace(namespace, _request_timeout=5)


def needs_fake(env: KubeEnv) -> FakeKube:
    """The fake server, or skip: a real API server cannot inject this fault on demand."""
    if env.fake is None:
        pytest.skip("fault injection needs the fake API server")
    return env.fake
