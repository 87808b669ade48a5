"""The Kubernetes source: list+watch the pool, its pods, models and objectives into the datastore.

Each watched resource runs the same loop (as kopf does): list, apply the whole list with
`replace_*` (so objects deleted while we were away disappear), then watch from the list's
resourceVersion. Bookmarks advance the resourceVersion; a dropped connection or a
timeout re-watches from the last resourceVersion after a jittered backoff; 410 Gone
relists. A failure never clears the datastore: routing goes on with the last known state.

The `kubernetes` client blocks, so every call runs in `asyncio.to_thread`; a watch hands
each raw event back with `loop.call_soon_threadsafe`, and only code on the loop parses
events and mutates the datastore. Watches use a short server-side `timeoutSeconds` and
are stopped (socket shut down) on cancellation, so shutdown is prompt.

Also written here: InferenceModel `Accepted` conditions (status subresource, only when they
change) and a Warning Event for each object the EPP rejects.

Every API call goes through `_call` with its (group, resource, verb) from `API_CALLS`,
the table the RBAC Role in `manifests/epp/` is checked against.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime
import json
import logging
import random
import socket
import threading
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import urllib3
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException
from kubernetes.watch.watch import iter_resp_lines

from epp.clock import Clock
from epp.kube.api import load_api_client
from epp.picker.datastore.store import Datastore
from epp.picker.datastore.types import InferenceModel, InferenceObjective, PodInfo
from epp.picker.sources.objects import (
    INFERENCE_MODEL,
    INFERENCE_OBJECTIVE,
    POD,
    ApiResource,
    ObjectError,
    parse_inference_model,
    parse_inference_objective,
    parse_pod,
    parse_pool,
    pool_resource,
)

log = logging.getLogger(__name__)

T = TypeVar("T")
RawObject = dict[str, Any]
Key = tuple[str, str]  # (namespace, name)

ACCEPTED_CONDITION = "Accepted"
EVENT_REASON_INVALID = "InvalidObject"
EVENT_COMPONENT = "epp"
MAX_REPORTED = 10_000
HTTP_GONE = 410
DENIED = frozenset({401, 403})  # the EPP's credentials or its RBAC: no retry will change that alone
HTTP_CONFLICT = 409
HTTP_NOT_FOUND = 404

# (apiGroup, resource, verb) of every call this module makes; RBAC must grant exactly these
# (plus `epp.kube.leader.API_CALLS` when leader election is on).
API_CALLS: frozenset[tuple[str, str, str]] = frozenset(
    {
        *(
            (g, "inferencepools", v)
            for g in ("inference.networking.k8s.io", "inference.networking.x-k8s.io")
            for v in ("list", "watch")
        ),
        *(
            ("inference.networking.x-k8s.io", r, v)
            for r in ("inferencemodels", "inferenceobjectives")
            for v in ("list", "watch")
        ),
        ("", "pods", "list"),
        ("", "pods", "watch"),
        ("inference.networking.x-k8s.io", "inferencemodels/status", "patch"),
        ("", "events", "create"),
    }
)


class _WatchGone(Exception):
    """The resourceVersion is too old (410 Gone): relist."""


class _WatchFailed(Exception):
    """The connection dropped or the server answered an error: re-watch after a backoff.

    `resource_version` is where to resume (events before the failure were applied);
    None means relist.
    """

    def __init__(
        self, message: str, resource_version: str | None = None, *, status: int | None = None
    ) -> None:
        super().__init__(message)
        self.resource_version = resource_version
        self.status = status


def _check_status(response: Any, what: str, resource_version: str | None) -> None:
    """`_preload_content=False` responses do not raise: turn an error status into ours."""
    status = int(getattr(response, "status", 200))
    if 200 <= status <= 299:
        return
    response.release_conn()
    if status == HTTP_GONE:
        raise _WatchGone()
    raise _WatchFailed(f"{what}: HTTP {status}", resource_version, status=status)


def _shutdown(response: Any) -> None:
    """Unblock a thread reading a watch stream by shutting its socket down."""
    connection = getattr(response, "connection", None)
    sock = getattr(connection, "sock", None)
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)


def _label_selector(selector: Mapping[str, str]) -> str:
    return ",".join(f"{key}={value}" for key, value in sorted(selector.items()))


def _key_of(obj: Mapping[str, Any]) -> Key:
    meta = obj.get("metadata") or {}
    return (str(meta.get("namespace", "")), str(meta.get("name", "")))


def _utc_now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


@dataclasses.dataclass(frozen=True, slots=True)
class _Desired:
    """The Accepted condition one InferenceModel should carry."""

    status: str
    reason: str
    message: str
    generation: int


@dataclasses.dataclass(frozen=True, slots=True)
class PoolRef:
    """The one InferencePool this source follows; its pods, models and objectives share its namespace.

    `group` picks the pool's API group (the GA one or the older x-k8s.io one).
    """

    name: str
    namespace: str
    group: str


@dataclasses.dataclass(frozen=True, slots=True)
class WatchTiming:
    """How long API calls may take and how retries back off.

    A short server-side watch timeout keeps shutdown prompt; the jittered backoff keeps
    replicas from hammering a failing API server in step.
    """

    watch_timeout_s: int = 5
    request_timeout_s: float = 10.0
    backoff_initial_s: float = 0.1
    backoff_max_s: float = 5.0

    @property
    def watch_read_timeout_s(self) -> float:
        """A watch stream may stay silent until the server ends it, plus the usual request slack."""
        return self.watch_timeout_s + self.request_timeout_s


class KubeSource:
    """Keeps the datastore in step with the cluster for one InferencePool.

    `synced` is set once the pool, its pods, models and objectives have all been listed and
    their watches accepted (readiness waits for it, and for `denied` to be empty). `run` returns
    only when cancelled.
    """

    def __init__(
        self,
        datastore: Datastore,
        *,
        pool: PoolRef,
        kubeconfig: str | None,
        clock: Clock,
        api_client: k8s.ApiClient | None = None,
        timing: WatchTiming = WatchTiming(),
        wall_clock: Callable[[], datetime.datetime] = _utc_now,
    ) -> None:
        self._datastore = datastore
        self._pool = pool
        self._pool_resource = pool_resource(pool.group)
        self._kubeconfig = kubeconfig
        self._clock = clock
        self._api_client = api_client
        self._timing = timing
        self._wall_clock = wall_clock
        self.synced = asyncio.Event()
        self._denied: dict[str, str] = {}
        # Bookmarks the API server sent (they only move a watch's resourceVersion on).
        self.bookmarks = 0
        self._listed: set[str] = set()
        self._pool_changed = asyncio.Event()
        self._models_changed = asyncio.Event()
        # Last good parsed objects, so an invalid update keeps the previous state.
        self._pods: dict[Key, PodInfo] = {}
        self._models: dict[Key, InferenceModel] = {}
        self._objectives: dict[Key, InferenceObjective] = {}
        self._model_raw: dict[Key, RawObject] = {}
        self._patched: dict[Key, _Desired] = {}
        self._reported: set[tuple[str, str]] = set()  # (uid, resourceVersion) already in an Event
        self._random = random.Random()
        self._events: asyncio.Queue[RawObject] = asyncio.Queue(maxsize=1000)

    # -- running ---------------------------------------------------------------------------

    async def run(self) -> None:
        if self._api_client is None:
            self._api_client = await asyncio.to_thread(load_api_client, self._kubeconfig)
        self._core = k8s.CoreV1Api(self._api_client)
        self._custom = k8s.CustomObjectsApi(self._api_client)
        self._datastore.on_models_changed(self._models_changed.set)
        async with asyncio.TaskGroup() as tasks:
            tasks.create_task(self._watch_resource("pool", self._list_pool, self._apply_pool))
            tasks.create_task(
                self._watch_resource("models", self._list_custom(INFERENCE_MODEL), self._apply_model)
            )
            tasks.create_task(
                self._watch_resource(
                    "objectives", self._list_custom(INFERENCE_OBJECTIVE), self._apply_objective
                )
            )
            tasks.create_task(self._supervise_pods())
            tasks.create_task(self._write_statuses())
            tasks.create_task(self._emit_events())

    async def _watch_resource(
        self,
        name: str,
        list_call: Callable[..., Any],
        apply: Callable[[str, RawObject], None],
        selector: str = "",
        on_list: Callable[[list[RawObject]], None] | None = None,
    ) -> None:
        """List, then watch from the list's resourceVersion, forever (see the module docstring)."""
        backoff_s = self._timing.backoff_initial_s
        resource_version: str | None = None
        while True:
            try:
                if resource_version is None:
                    items, resource_version = await self._list(list_call, selector)
                    (on_list or self._replace_for(name))(items)
                resource_version = await self._watch_once(
                    list_call, selector, resource_version, apply, opened=lambda: self._watching(name)
                )
                backoff_s = self._timing.backoff_initial_s
                continue
            except _WatchGone:
                log.info("watch expired, relisting", extra={"resource": name})
                resource_version = None
                continue
            except _WatchFailed as error:
                if error.status in DENIED:
                    self._deny(name, error)
                else:
                    log.warning("watch failed, retrying", extra={"resource": name, "error": str(error)})
                if resource_version is not None:
                    resource_version = error.resource_version
            delay_s = backoff_s * (0.5 + self._random.random())
            backoff_s = min(self._timing.backoff_max_s, backoff_s * 2)
            await self._clock.sleep(delay_s)

    async def _list(self, list_call: Callable[..., Any], selector: str) -> tuple[list[RawObject], str]:
        def call() -> tuple[list[RawObject], str]:
            response = list_call(
                label_selector=selector or None,
                _preload_content=False,
                _request_timeout=self._timing.request_timeout_s,
            )
            _check_status(response, "list", None)
            body = json.loads(response.data)
            return list(body.get("items") or []), str(body["metadata"]["resourceVersion"])

        try:
            return await asyncio.to_thread(call)
        except ApiException as error:
            raise _WatchFailed(f"list: {error.status} {error.reason}", status=error.status) from error
        except (urllib3.exceptions.HTTPError, OSError, ValueError, KeyError) as error:
            raise _WatchFailed(f"list: {error}") from error

    async def _watch_once(
        self,
        list_call: Callable[..., Any],
        selector: str,
        resource_version: str,
        apply: Callable[[str, RawObject], None],
        opened: Callable[[], None],
    ) -> str:
        """One watch request; returns the resourceVersion to resume from. `opened` is called
        once the API server has accepted it."""
        loop = asyncio.get_running_loop()
        stopped = threading.Event()
        response: Any = None
        latest = resource_version

        def deliver(event_type: str, obj: RawObject) -> None:
            if not stopped.is_set():
                apply(event_type, obj)

        def stream() -> str:
            nonlocal latest, response
            response = list_call(
                watch=True,
                label_selector=selector or None,
                resource_version=resource_version,
                timeout_seconds=self._timing.watch_timeout_s,
                allow_watch_bookmarks=True,
                _preload_content=False,
                _request_timeout=(self._timing.request_timeout_s, self._timing.watch_read_timeout_s),
            )
            _check_status(response, "watch", resource_version)
            loop.call_soon_threadsafe(opened)
            try:
                for line in iter_resp_lines(response):  # type: ignore[no-untyped-call]  # untyped upstream
                    if stopped.is_set():
                        break
                    if not line.strip():
                        continue
                    event = json.loads(line)
                    event_type = str(event.get("type"))
                    obj = event.get("object") or {}
                    if event_type == "ERROR":
                        code = int(obj.get("code") or 0)
                        if code == HTTP_GONE:
                            raise _WatchGone()
                        raise _WatchFailed(f"watch: error event {code} {obj.get('message')}", latest)
                    rv = (obj.get("metadata") or {}).get("resourceVersion")
                    if rv:
                        latest = str(rv)
                    if event_type == "BOOKMARK":
                        self.bookmarks += 1
                    else:
                        loop.call_soon_threadsafe(deliver, event_type, obj)
            finally:
                response.release_conn()
            return latest

        try:
            return await asyncio.to_thread(stream)
        except ApiException as error:
            if error.status == HTTP_GONE:
                raise _WatchGone() from error
            raise _WatchFailed(
                f"watch: {error.status} {error.reason}", latest, status=error.status
            ) from error
        except (urllib3.exceptions.HTTPError, OSError, ValueError) as error:
            # What was delivered before the drop stays applied: resume from `latest`.
            raise _WatchFailed(f"watch: {error}", latest) from error
        finally:
            stopped.set()
            _shutdown(response)

    @property
    def denied(self) -> dict[str, str]:
        """Resources the API server refuses to let this EPP list or watch (401/403), and why.
        While any is, the EPP is not ready: it would route on a view that can no longer change."""
        return dict(self._denied)

    def _deny(self, name: str, error: _WatchFailed) -> None:
        if name not in self._denied:
            log.error(
                "the API server refuses this EPP's calls for a resource: grant its ServiceAccount the "
                "list and watch verbs on it (see the chart's Role); not ready until then",
                extra={"resource": name, "error": str(error)},
            )
        self._denied[name] = str(error)

    def _watching(self, name: str) -> None:
        """The API server accepted a watch of `name`: listed and watched, the view is live."""
        if self._denied.pop(name, None) is not None:
            log.info("the API server allows this EPP's watch again", extra={"resource": name})
        self._mark_listed(name)

    def _mark_listed(self, name: str) -> None:
        self._listed.add(name)
        if {"pool", "pods", "models", "objectives"} <= self._listed and not self.synced.is_set():
            log.info("kubernetes source synced", extra={"pool": self._pool.name})
            self.synced.set()

    def _replace_for(self, name: str) -> Callable[[list[RawObject]], None]:
        return {
            "pool": self._replace_pool,
            "models": self._replace_models,
            "objectives": self._replace_objectives,
        }[name]

    # -- API calls -------------------------------------------------------------------------

    def _list_custom(self, resource: ApiResource) -> Callable[..., Any]:
        def list_call(**kwargs: Any) -> Any:
            self._check_call(resource.group, resource.plural, "watch" if kwargs.get("watch") else "list")
            return self._custom.list_namespaced_custom_object(
                resource.group, resource.version, self._pool.namespace, resource.plural, **kwargs
            )

        return list_call

    def _list_pool(self, **kwargs: Any) -> Any:
        return self._list_custom(self._pool_resource)(
            field_selector=f"metadata.name={self._pool.name}", **kwargs
        )

    def _list_pods(self, **kwargs: Any) -> Any:
        self._check_call("", "pods", "watch" if kwargs.get("watch") else "list")
        return self._core.list_namespaced_pod(self._pool.namespace, **kwargs)

    @staticmethod
    def _check_call(group: str, resource: str, verb: str) -> None:
        if (group, resource, verb) not in API_CALLS:
            raise AssertionError(f"API call {(group, resource, verb)} is missing from API_CALLS")

    # -- pool ------------------------------------------------------------------------------

    def _replace_pool(self, items: list[RawObject]) -> None:
        named = [o for o in items if _key_of(o) == (self._pool.namespace, self._pool.name)]
        if named:
            self._apply_pool("ADDED", named[0])
        elif self._datastore.pool is not None:
            self._apply_pool("DELETED", {})

    def _apply_pool(self, event_type: str, obj: RawObject) -> None:
        if event_type == "ERROR":
            return
        if event_type == "DELETED" or (obj.get("metadata") or {}).get("deletionTimestamp"):
            if self._datastore.pool is not None:
                log.warning("inference pool deleted", extra={"pool": self._pool.name})
                self._datastore.set_pool(None)
                self._pool_changed.set()
            return
        self._set_pool_from(obj)

    def _set_pool_from(self, obj: RawObject) -> None:
        raw = dict(obj)
        raw.setdefault("apiVersion", self._pool_resource.api_version)
        raw.setdefault("kind", "InferencePool")
        try:
            pool = parse_pool(raw, default_namespace=self._pool.namespace)
        except ObjectError as error:
            self._reject(raw, error)
            return
        old = self._datastore.pool
        if old == pool:
            return
        self._datastore.set_pool(pool)
        if old is None or old.selector != pool.selector:
            self._pool_changed.set()

    # -- pods ------------------------------------------------------------------------------

    async def _supervise_pods(self) -> None:
        """Watch pods with the pool's selector; a new selector restarts the watch (full resync).

        The pod watch is this task's child: if it fails, this task fails with it.
        """
        current: asyncio.Task[None] | None = None
        current_selector: Mapping[str, str] | None = None
        changed: asyncio.Future[Any] | None = None
        try:
            while True:
                changed = asyncio.ensure_future(self._pool_changed.wait())
                waiting: set[asyncio.Future[Any]] = {changed}
                if current is not None:
                    waiting.add(current)
                done, _ = await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
                if current is not None and current in done:
                    changed.cancel()
                    current.result()  # raises what ended the pod watch
                    raise RuntimeError("pod watch ended")
                self._pool_changed.clear()
                pool = self._datastore.pool
                selector = None if pool is None else pool.selector
                if selector == current_selector:
                    continue
                if current is not None:
                    current.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await current
                    current = None
                current_selector = selector
                if selector is None:
                    self._pods = {}
                    self._datastore.replace_pods(())
                    continue
                log.info("pod selector changed, resyncing pods", extra={"selector": dict(selector)})
                current = asyncio.create_task(
                    self._watch_resource(
                        "pods",
                        self._list_pods,
                        self._apply_pod,
                        selector=_label_selector(selector),
                        on_list=self._replace_pods,
                    )
                )
        finally:
            if changed is not None:
                changed.cancel()
            if current is not None:
                current.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await current

    def _parse_pod(self, obj: RawObject) -> PodInfo | None:
        raw = dict(obj)
        raw.setdefault("apiVersion", POD.api_version)
        raw.setdefault("kind", "Pod")
        try:
            return parse_pod(raw, default_namespace=self._pool.namespace)
        except ObjectError as error:
            log.warning("ignoring unreadable pod", extra={"pod": _key_of(obj)[1], "error": str(error)})
            return None

    def _replace_pods(self, items: list[RawObject]) -> None:
        pods: dict[Key, PodInfo] = {}
        for obj in items:
            key = _key_of(obj)
            pod = self._parse_pod(obj)
            if pod is None:
                pod = self._pods.get(key)
            if pod is not None:
                pods[key] = pod
        self._pods = pods
        self._datastore.replace_pods(pods.values())

    def _apply_pod(self, event_type: str, obj: RawObject) -> None:
        key = _key_of(obj)
        if event_type == "DELETED":
            self._pods.pop(key, None)
            self._datastore.delete_pod(*key)
            return
        pod = self._parse_pod(obj)
        if pod is not None:
            self._pods[key] = pod
            self._datastore.upsert_pod(pod)

    # -- models and objectives -------------------------------------------------------------

    def _parse_model(self, obj: RawObject) -> InferenceModel | None:
        raw = dict(obj)
        raw.setdefault("apiVersion", INFERENCE_MODEL.api_version)
        raw.setdefault("kind", "InferenceModel")
        try:
            return parse_inference_model(raw, default_namespace=self._pool.namespace)
        except ObjectError as error:
            self._reject(raw, error)
            return None

    def _replace_models(self, items: list[RawObject]) -> None:
        models: dict[Key, InferenceModel] = {}
        raws: dict[Key, RawObject] = {}
        for obj in items:
            key = _key_of(obj)
            raws[key] = obj
            model = self._parse_model(obj) or self._models.get(key)
            if model is not None:
                models[key] = model
        self._models, self._model_raw = models, raws
        self._datastore.replace_models(models.values())

    def _apply_model(self, event_type: str, obj: RawObject) -> None:
        key = _key_of(obj)
        if event_type == "DELETED":
            self._models.pop(key, None)
            self._model_raw.pop(key, None)
            self._patched.pop(key, None)
            self._datastore.delete_model(*key)
            return
        self._model_raw[key] = obj
        model = self._parse_model(obj)
        if model is None:
            return
        if self._models.get(key) == model:
            self._models_changed.set()  # status may still need writing (e.g. someone cleared it)
            return
        self._models[key] = model
        self._datastore.upsert_model(model)

    def _parse_objective(self, obj: RawObject) -> InferenceObjective | None:
        raw = dict(obj)
        raw.setdefault("apiVersion", INFERENCE_OBJECTIVE.api_version)
        raw.setdefault("kind", "InferenceObjective")
        try:
            return parse_inference_objective(raw, default_namespace=self._pool.namespace)
        except ObjectError as error:
            self._reject(raw, error)
            return None

    def _replace_objectives(self, items: list[RawObject]) -> None:
        objectives: dict[Key, InferenceObjective] = {}
        for obj in items:
            key = _key_of(obj)
            objective = self._parse_objective(obj) or self._objectives.get(key)
            if objective is not None:
                objectives[key] = objective
        self._objectives = objectives
        self._datastore.replace_objectives(objectives.values())

    def _apply_objective(self, event_type: str, obj: RawObject) -> None:
        key = _key_of(obj)
        if event_type == "DELETED":
            self._objectives.pop(key, None)
            self._datastore.delete_objective(*key)
            return
        objective = self._parse_objective(obj)
        if objective is not None and self._objectives.get(key) != objective:
            self._objectives[key] = objective
            self._datastore.upsert_objective(objective)

    # -- status and events -----------------------------------------------------------------

    async def _write_statuses(self) -> None:
        """Patch each InferenceModel's Accepted condition whenever the winners change."""
        while True:
            await self._models_changed.wait()
            self._models_changed.clear()
            for status in self._datastore.model_statuses():
                key = (status.model.namespace, status.model.name)
                raw = self._model_raw.get(key, {})
                desired = _Desired(
                    status="True" if status.accepted else "False",
                    reason=status.reason,
                    message=status.message,
                    generation=int((raw.get("metadata") or {}).get("generation") or 0),
                )
                if self._patched.get(key) == desired or _has_condition(raw, desired):
                    continue
                if await self._patch_status(key, desired):
                    self._patched[key] = desired

    async def _patch_status(self, key: Key, desired: _Desired) -> bool:
        body = {"status": {"conditions": self._conditions(self._model_raw.get(key, {}), desired)}}

        def call() -> None:
            self._check_call(INFERENCE_MODEL.group, "inferencemodels/status", "patch")
            self._custom.patch_namespaced_custom_object_status(
                INFERENCE_MODEL.group,
                INFERENCE_MODEL.version,
                key[0],
                INFERENCE_MODEL.plural,
                key[1],
                body,
                _request_timeout=self._timing.request_timeout_s,
            )

        try:
            await asyncio.to_thread(call)
        except ApiException as error:
            if error.status != HTTP_NOT_FOUND:
                log.warning(
                    "cannot write InferenceModel status",
                    extra={"model": key[1], "status": error.status, "error": str(error.reason)},
                )
            return False
        except (urllib3.exceptions.HTTPError, OSError) as error:
            log.warning("cannot write InferenceModel status", extra={"model": key[1], "error": str(error)})
            return False
        log.info(
            "InferenceModel status written",
            extra={"model": key[1], "accepted": desired.status, "reason": desired.reason},
        )
        return True

    def _conditions(self, raw: Mapping[str, Any], desired: _Desired) -> list[dict[str, Any]]:
        """The object's conditions with Accepted set; other types are kept (a merge patch
        replaces the whole list), and lastTransitionTime moves only when the status does."""
        existing = [c for c in (raw.get("status") or {}).get("conditions") or [] if isinstance(c, Mapping)]
        previous = next((c for c in existing if c.get("type") == ACCEPTED_CONDITION), None)
        transition = (
            str(previous["lastTransitionTime"])
            if previous is not None
            and previous.get("status") == desired.status
            and previous.get("lastTransitionTime")
            else self._wall_clock().strftime("%Y-%m-%dT%H:%M:%SZ")
        )
        condition: dict[str, Any] = {
            "type": ACCEPTED_CONDITION,
            "status": desired.status,
            "reason": desired.reason,
            "message": desired.message,
            "lastTransitionTime": transition,
        }
        if desired.generation:
            condition["observedGeneration"] = desired.generation
        others = [dict(c) for c in existing if c.get("type") != ACCEPTED_CONDITION]
        return [*others, condition]

    def _reject(self, obj: RawObject, error: ObjectError) -> None:
        """Log a rejected object and tell its owner with a Warning Event (once per version)."""
        meta = obj.get("metadata") or {}
        log.warning("rejected object", extra={"object": meta.get("name"), "error": str(error)})
        seen = (str(meta.get("uid", "")), str(meta.get("resourceVersion", "")))
        if seen in self._reported or not meta.get("name"):
            return
        if len(self._reported) >= MAX_REPORTED:
            self._reported.clear()  # bounded memory; at worst an old object is reported again
        self._reported.add(seen)
        now = self._wall_clock()
        event = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{meta.get('name')}.", "namespace": self._pool.namespace},
            "involvedObject": {
                "apiVersion": obj.get("apiVersion"),
                "kind": obj.get("kind"),
                "name": meta.get("name"),
                "namespace": meta.get("namespace", self._pool.namespace),
                "uid": meta.get("uid"),
                "resourceVersion": meta.get("resourceVersion"),
            },
            "reason": EVENT_REASON_INVALID,
            "message": str(error),
            "type": "Warning",
            "count": 1,
            "firstTimestamp": now.strftime("%Y-%m-%dT%H:%M:%SZ"),
            "lastTimestamp": now.strftime("%Y-%m-%dT%H:%M:%SZ"),
            "source": {"component": EVENT_COMPONENT},
            "reportingComponent": EVENT_COMPONENT,
        }
        try:
            self._events.put_nowait(event)
        except asyncio.QueueFull:
            log.warning("event queue full, dropping event", extra={"object": meta.get("name")})

    async def _emit_events(self) -> None:
        while True:
            event = await self._events.get()

            body = k8s.CoreV1Event.from_dict(event)
            if body is None:
                continue

            def call(body: k8s.CoreV1Event = body) -> None:
                self._check_call("", "events", "create")
                self._core.create_namespaced_event(
                    self._pool.namespace, body, _request_timeout=self._timing.request_timeout_s
                )

            try:
                await asyncio.to_thread(call)
            except (ApiException, urllib3.exceptions.HTTPError, OSError) as error:
                log.warning("cannot emit event", extra={"error": str(error)})


def _has_condition(raw: Mapping[str, Any], desired: _Desired) -> bool:
    conditions = (raw.get("status") or {}).get("conditions") or []
    for condition in conditions:
        if isinstance(condition, Mapping) and condition.get("type") == ACCEPTED_CONDITION:
            return (
                condition.get("status") == desired.status
                and condition.get("reason") == desired.reason
                and condition.get("message") == desired.message
                and int(condition.get("observedGeneration") or 0) == desired.generation
            )
    return False
