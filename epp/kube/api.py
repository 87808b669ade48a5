"""A small dict-in, dict-out client over the official `kubernetes` ApiClient.

The controller handles a dozen kinds (core, apps, rbac and custom resources) the same way,
so it talks JSON to their REST paths through `ApiClient` (configuration, auth, TLS and
retries stay the official client's) instead of one typed API class per kind.

`KubeApi` blocks; `AsyncKubeApi` offers the same calls to code on an asyncio loop (each
call runs in `asyncio.to_thread`) plus a watch that stops promptly when cancelled, and
`list_then_watch` is one list-then-watch pass over a resource, the building block of a
controller's resync loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
from collections.abc import AsyncIterator, Generator, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import urllib3
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


# What a call may raise when the API server says no or cannot be reached: callers that retry
# later catch these (and only these), so a bug in their own code still surfaces.
API_ERRORS: tuple[type[Exception], ...] = (KubeApiError, OSError, urllib3.exceptions.HTTPError)


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
        return _watch_events(self.open_watch(ref, namespace, resource_version, timeout_s))

    def open_watch(
        self, ref: ResourceRef, namespace: str, resource_version: str, timeout_s: int
    ) -> urllib3.BaseHTTPResponse:
        """The open watch stream (read it with `watch`'s events); the server ends it after `timeout_s`.

        The read timeout is `timeout_s` plus the request timeout: a watch may stay silent
        until the server ends it.
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
        response: urllib3.BaseHTTPResponse = self._api.rest_client.pool_manager.request(
            "GET", url, headers=headers, preload_content=False, timeout=self._timeout_s + timeout_s
        )
        if response.status != 200:
            response.release_conn()
            raise KubeApiError(int(response.status), "watch refused")
        return response

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


def _watch_events(response: urllib3.BaseHTTPResponse) -> Generator[tuple[str, Obj], None, None]:
    try:
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


def _shut_down(response: urllib3.BaseHTTPResponse) -> None:
    """Unblock a thread reading `response` by shutting its socket down."""
    sock = getattr(getattr(response, "connection", None), "sock", None)
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)


_END_OF_STREAM: Any = object()


class AsyncKubeApi:
    """`KubeApi`'s calls for code on an asyncio loop.

    The official client blocks, so each call runs in `asyncio.to_thread`; the loop keeps
    the control flow and every result comes back to it. Cancelling a call abandons its
    answer (the thread finishes within the request timeout); cancelling a `watch` also
    shuts its stream down, so the thread reading it ends at once.
    """

    def __init__(self, api_client: k8s.ApiClient, request_timeout_s: float = 10.0) -> None:
        self._api = KubeApi(api_client, request_timeout_s)

    async def get(self, ref: ResourceRef, namespace: str, name: str) -> Obj | None:
        return await asyncio.to_thread(self._api.get, ref, namespace, name)

    async def list(self, ref: ResourceRef, namespace: str, label_selector: str = "") -> Objs:
        return await asyncio.to_thread(self._api.list, ref, namespace, label_selector)

    async def list_with_version(
        self, ref: ResourceRef, namespace: str, label_selector: str = ""
    ) -> tuple[Objs, str]:
        """The items and the list's resourceVersion (where a watch resumes)."""
        return await asyncio.to_thread(self._api.list_with_version, ref, namespace, label_selector)

    async def watch(
        self, ref: ResourceRef, namespace: str, resource_version: str, timeout_s: int
    ) -> AsyncIterator[tuple[str, Obj]]:
        """(event type, object) from `resource_version` until the server ends the watch.

        Raises as `KubeApi.watch` does. Each event is read in a thread and handed back, one
        at a time, so a slow consumer holds the stream back instead of piling events up.
        """
        response = await asyncio.to_thread(self._api.open_watch, ref, namespace, resource_version, timeout_s)
        events = _watch_events(response)
        try:
            while True:
                event = await asyncio.to_thread(next, events, _END_OF_STREAM)
                if event is _END_OF_STREAM:
                    return
                yield event
        except asyncio.CancelledError:
            # A thread is reading the stream: shutting the socket down ends that read at once
            # (the stream's own cleanup then runs in the thread), and the dead connection is
            # never reused.
            _shut_down(response)
            raise
        except GeneratorExit:
            # Abandoned between events: nothing is reading, so close the stream here.
            _shut_down(response)
            events.close()
            raise

    async def create(self, obj: Mapping[str, Any]) -> Obj:
        return await asyncio.to_thread(self._api.create, obj)

    async def patch(self, ref: ResourceRef, namespace: str, name: str, patch: Mapping[str, Any]) -> Obj:
        return await asyncio.to_thread(self._api.patch, ref, namespace, name, patch)

    async def delete(self, ref: ResourceRef, namespace: str, name: str) -> bool:
        return await asyncio.to_thread(self._api.delete, ref, namespace, name)

    async def patch_status(
        self, ref: ResourceRef, namespace: str, name: str, status: Mapping[str, Any]
    ) -> Obj:
        return await asyncio.to_thread(self._api.patch_status, ref, namespace, name, status)


LISTED = "LISTED"  # the event type `list_then_watch` gives each object of the list


async def list_then_watch(
    api: AsyncKubeApi, ref: ResourceRef, namespace: str, watch_timeout_s: int
) -> AsyncIterator[tuple[str, Obj]]:
    """One pass over `ref` in `namespace`: every object listed, then every change after the list.

    Yields (`LISTED`, object) for each listed object, then the watch's (event type, object)
    from the list's resourceVersion, so no change between the two is missed. Returns when
    the server ends the watch after `watch_timeout_s` (the caller's resync: the next pass
    lists everything again). Raises one of `API_ERRORS` when a call fails, `KubeApiError`
    with status 410 when the list's version is already gone; either way the caller relists.
    """
    items, resource_version = await api.list_with_version(ref, namespace)
    for obj in items:
        yield LISTED, obj
    async for event in api.watch(ref, namespace, resource_version, watch_timeout_s):
        yield event
