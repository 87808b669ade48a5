"""A small dict-in, dict-out client over the official `kubernetes` ApiClient.

The controller handles a dozen kinds (core, apps, rbac and custom resources) the same way,
so it talks JSON to their REST paths through `ApiClient` (configuration, auth, TLS and
retries stay the official client's) instead of one typed API class per kind.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from kubernetes import client as k8s
from kubernetes import config as k8s_config
from kubernetes.config.config_exception import ConfigException
from kubernetes.watch.watch import iter_resp_lines

from epp.errors import ConfigError


def load_api_client(kubeconfig: str | None) -> k8s.ApiClient:
    """In-cluster config when running in a pod, else the kubeconfig file (explicit or default)."""
    configuration = k8s.Configuration()
    if kubeconfig is None:
        try:
            k8s_config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]  # untyped upstream
            return k8s.ApiClient(configuration)
        except ConfigException:
            pass
    try:
        k8s_config.load_kube_config(config_file=kubeconfig, client_configuration=configuration)  # type: ignore[no-untyped-call]  # untyped upstream
    except (ConfigException, OSError) as error:
        raise ConfigError(f"cannot load Kubernetes configuration: {error}") from error
    return k8s.ApiClient(configuration)


Obj = dict[str, Any]
Objs = list[Obj]  # (a name: `KubeApi.list` hides the builtin inside the class)

# kind → plural resource name (all kinds the controller touches).
PLURALS: Mapping[str, str] = {
    "Deployment": "deployments",
    "Service": "services",
    "ConfigMap": "configmaps",
    "ServiceAccount": "serviceaccounts",
    "Role": "roles",
    "RoleBinding": "rolebindings",
    "InferencePool": "inferencepools",
    "InferenceModel": "inferencemodels",
    "Event": "events",
    "Pod": "pods",
    "LLMInferenceService": "llminferenceservices",
}


class KubeApiError(Exception):
    """A non-2xx answer; `status` is the HTTP code, the message the API server's."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"HTTP {status}: {message}")
        self.status = status


@dataclass(frozen=True, slots=True)
class ResourceRef:
    api_version: str
    kind: str

    @property
    def group(self) -> str:
        return self.api_version.rpartition("/")[0]

    @property
    def plural(self) -> str:
        return PLURALS[self.kind]

    def collection_path(self, namespace: str) -> str:
        prefix = f"/apis/{self.api_version}" if self.group else f"/api/{self.api_version}"
        return f"{prefix}/namespaces/{namespace}/{self.plural}"


def ref_of(obj: Mapping[str, Any]) -> ResourceRef:
    return ResourceRef(str(obj["apiVersion"]), str(obj["kind"]))


class KubeApi:
    """get / list / create / merge-patch (object or status) for any namespaced kind."""

    def __init__(self, api_client: k8s.ApiClient, request_timeout_s: float = 10.0) -> None:
        self._api = api_client
        self._timeout_s = request_timeout_s

    def _call(
        self,
        method: str,
        path: str,
        body: Any = None,
        query: list[tuple[str, str]] | None = None,
        patch: bool = False,
    ) -> Obj:
        headers = {"Accept": "application/json"}
        if body is not None:
            headers["Content-Type"] = "application/merge-patch+json" if patch else "application/json"
        _, url, header_params, serialized, post_params = self._api.param_serialize(
            method=method,
            resource_path=path,
            query_params=query or [],
            header_params=headers,
            body=body,
            auth_settings=["BearerToken"],
        )
        response = self._api.call_api(method, url, header_params, serialized, post_params, self._timeout_s)
        data = response.read()  # type: ignore[no-untyped-call]  # untyped upstream
        status = int(response.status)
        try:
            payload: Any = json.loads(data) if data else {}
        except ValueError:
            payload = {"message": data.decode(errors="replace") if isinstance(data, bytes) else str(data)}
        if not 200 <= status <= 299:
            message = payload.get("message", "") if isinstance(payload, dict) else str(payload)
            raise KubeApiError(status, str(message))
        if not isinstance(payload, dict):
            raise KubeApiError(status, "expected a JSON object")
        return payload

    def get(self, ref: ResourceRef, namespace: str, name: str) -> Obj | None:
        try:
            return self._call("GET", f"{ref.collection_path(namespace)}/{name}")
        except KubeApiError as error:
            if error.status == 404:
                return None
            raise

    def list(self, ref: ResourceRef, namespace: str, label_selector: str = "") -> Objs:
        return self.list_with_version(ref, namespace, label_selector)[0]

    def list_with_version(
        self, ref: ResourceRef, namespace: str, label_selector: str = ""
    ) -> tuple[Objs, str]:
        """The items and the list's resourceVersion (where a watch resumes)."""
        query = [("labelSelector", label_selector)] if label_selector else []
        payload = self._call("GET", ref.collection_path(namespace), query=query)
        items = [dict(item) for item in payload.get("items") or []]
        return items, str((payload.get("metadata") or {}).get("resourceVersion", ""))

    def watch(
        self, ref: ResourceRef, namespace: str, resource_version: str, timeout_s: int
    ) -> Iterator[tuple[str, Obj]]:
        """(event type, object) from `resource_version` until the server ends the watch.

        Raises `KubeApiError` (410 when the version is too old: relist) on an error status
        or an ERROR event.
        """
        query = [
            ("watch", "true"),
            ("resourceVersion", resource_version),
            ("timeoutSeconds", str(timeout_s)),
            ("allowWatchBookmarks", "true"),
        ]
        _, url, headers, _, _ = self._api.param_serialize(
            method="GET",
            resource_path=ref.collection_path(namespace),
            query_params=query,
            header_params={"Accept": "application/json"},
            auth_settings=["BearerToken"],
        )
        response = self._api.rest_client.pool_manager.request(
            "GET", url, headers=headers, preload_content=False, timeout=self._timeout_s + timeout_s
        )
        try:
            if response.status != 200:
                raise KubeApiError(int(response.status), "watch refused")
            for line in iter_resp_lines(response):  # type: ignore[no-untyped-call]  # untyped upstream
                if not line.strip():
                    continue
                event = json.loads(line)
                obj = event.get("object") or {}
                if event.get("type") == "ERROR":
                    raise KubeApiError(int(obj.get("code", 500)), str(obj.get("message", "")))
                yield str(event.get("type")), dict(obj)
        finally:
            response.release_conn()

    def create(self, obj: Mapping[str, Any]) -> Obj:
        namespace = str(obj["metadata"]["namespace"])
        return self._call("POST", ref_of(obj).collection_path(namespace), body=dict(obj))

    def patch(self, ref: ResourceRef, namespace: str, name: str, patch: Mapping[str, Any]) -> Obj:
        return self._call("PATCH", f"{ref.collection_path(namespace)}/{name}", body=dict(patch), patch=True)

    def delete(self, ref: ResourceRef, namespace: str, name: str) -> bool:
        try:
            self._call("DELETE", f"{ref.collection_path(namespace)}/{name}")
        except KubeApiError as error:
            if error.status == 404:
                return False
            raise
        return True

    def patch_status(self, ref: ResourceRef, namespace: str, name: str, status: Mapping[str, Any]) -> Obj:
        path = f"{ref.collection_path(namespace)}/{name}/status"
        return self._call("PATCH", path, body={"status": dict(status)}, patch=True)
