"""A small, faithful Kubernetes API server for tests: real HTTP on loopback, real semantics.

Why not an existing one: `kmock` (by kopf's author) is a flexible HTTP mock whose
Kubernetes mode serves fixed objects; its lists carry a placeholder resourceVersion and
its watches do not resume from a resourceVersion, answer 410 Gone for compacted history,
filter by selectors or keep a status subresource. Those behaviours are exactly what the
EPP's list+watch code must survive, so this module implements them directly:

- one global, monotonically increasing resourceVersion; every write bumps it;
- list (`labelSelector` equality terms, `fieldSelector` on `metadata.name`/`metadata.namespace`);
- streaming watch (`watch=true&resourceVersion=N`): replays history after N, then live
  events as newline-delimited JSON (ADDED/MODIFIED/DELETED, BOOKMARK when
  `allowWatchBookmarks=true`), ends after `timeoutSeconds`; an ERROR event with code 410
  when N is older than the compacted history;
- get/create/update (optimistic concurrency: 409 on a stale resourceVersion)/merge-patch/
  delete, and the `status` subresource (a status patch changes only `status`);
- core Pods and Events, coordination Leases and any custom resource (both inference groups);
- owner-reference garbage collection, as the API server's garbage collector does it: after
  an object is deleted, objects in its namespace whose `ownerReferences` name its uid are
  deleted too (cascading to their own dependents), shortly after the delete answers, not
  during it. A dependent that still has a live owner only loses the dangling reference.
  `propagationPolicy` (query or DeleteOptions body): `Background` (the default) as above;
  `Orphan` removes the reference from the dependents and deletes none; `Foreground` first
  marks the owner (deletionTimestamp, the `foregroundDeletion` finalizer), deletes the
  dependents, then the owner. Not modelled: `blockOwnerDeletion` (Foreground waits for every
  dependent, not only blocking ones), cross-namespace or cluster-scoped owners, finalizers
  other than `foregroundDeletion`, and collecting dependents whose owner never existed.

Tests drive it through `FakeKube` (put/delete objects, compact history, drop every watch,
send bookmarks) while the real `kubernetes` client talks to it over HTTP, configured by
the kubeconfig file `FakeKube.write_kubeconfig` writes. The server runs its own event loop
in a background thread, so it serves while the test's loop (or a blocked client) waits.
"""

from __future__ import annotations

import asyncio
import builtins
import copy
import datetime
import json
import pathlib
import threading
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import yaml
from aiohttp import web

Obj = dict[str, Any]
ResourceKey = tuple[str, str, str]  # (group, version, plural); core group is ""
ObjectKey = tuple[str, str]  # (namespace, name)

KINDS: dict[str, str] = {
    "pods": "Pod",
    "events": "Event",
    "leases": "Lease",
    "inferencepools": "InferencePool",
    "inferencemodels": "InferenceModel",
    "inferenceobjectives": "InferenceObjective",
}


@dataclass(frozen=True, slots=True)
class ApiCall:
    """One request as RBAC sees it: (apiGroup, resource[/subresource], verb)."""

    group: str
    resource: str
    verb: str


@dataclass(slots=True)
class _Watcher:
    resource: ResourceKey
    namespace: str
    label_selector: dict[str, str]
    field_selector: dict[str, str]
    queue: asyncio.Queue[Obj | None] = field(default_factory=asyncio.Queue)


def _now_rfc3339() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _parse_selector(text: str) -> dict[str, str]:
    """Equality terms `k=v,k2==v2` (all the EPP sends); anything else is a 400."""
    terms: dict[str, str] = {}
    for term in filter(None, (t.strip() for t in text.split(","))):
        key, sep, value = term.partition("=")
        if not sep or "!" in key:
            raise web.HTTPBadRequest(text=f"unsupported selector term {term!r}")
        terms[key.strip()] = value.lstrip("=").strip()
    return terms


def _matches(obj: Mapping[str, Any], watcher_labels: dict[str, str], fields: dict[str, str]) -> bool:
    meta = obj.get("metadata", {})
    labels = meta.get("labels") or {}
    if any(labels.get(k) != v for k, v in watcher_labels.items()):
        return False
    for key, value in fields.items():
        if key == "metadata.name" and meta.get("name") != value:
            return False
        if key == "metadata.namespace" and meta.get("namespace") != value:
            return False
    return True


def _merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = _merge_patch(result.get(key), value)
    return result


def _status(code: int, reason: str, message: str) -> Obj:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }


def _error(code: int, reason: str, message: str) -> web.Response:
    return web.json_response(_status(code, reason, message), status=code)


class FakeKube:
    """The fake API server and the handle tests use to change what it serves.

    Thread-safe: test code calls `put`/`delete`/... from any thread; the state lives
    behind one lock and watchers are woken on the server's own loop.
    """

    def __init__(self, host: str = "127.0.0.1") -> None:
        self._host = host
        self._lock = threading.Lock()
        self._rv = 1
        self._objects: dict[ResourceKey, dict[ObjectKey, Obj]] = {}
        self._history: list[tuple[int, ResourceKey, str, Obj]] = []
        self._compacted_rv = 0  # a watch from an RV below this gets 410 Gone
        self._watchers: list[_Watcher] = []
        self.calls: list[ApiCall] = []
        self.bookmarks_sent = 0  # BOOKMARK events written to a watch stream
        self._loop: asyncio.AbstractEventLoop | None = None
        self._runner: web.AppRunner | None = None
        self._thread: threading.Thread | None = None
        self.port = 0

    # -- lifecycle -------------------------------------------------------------------------

    def start(self) -> None:
        started = threading.Event()

        def serve() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            asyncio.set_event_loop(loop)
            loop.run_until_complete(self._start_site())
            started.set()
            loop.run_forever()
            loop.run_until_complete(self._stop_site())
            loop.close()

        self._thread = threading.Thread(target=serve, name="fakekube", daemon=True)
        self._thread.start()
        if not started.wait(10):
            raise RuntimeError("fake API server did not start")

    def stop(self) -> None:
        if self._loop is None or self._thread is None:
            return
        self.drop_watches()
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop = None

    async def _start_site(self) -> None:
        app = web.Application()
        app.router.add_route("*", "/api/{version}/namespaces/{namespace}/{plural}", self._collection)
        app.router.add_route("*", "/api/{version}/namespaces/{namespace}/{plural}/{name}", self._item)
        app.router.add_route("*", "/api/{version}/namespaces/{namespace}/{plural}/{name}/{sub}", self._item)
        app.router.add_route("*", "/apis/{group}/{version}/namespaces/{namespace}/{plural}", self._collection)
        app.router.add_route(
            "*", "/apis/{group}/{version}/namespaces/{namespace}/{plural}/{name}", self._item
        )
        app.router.add_route(
            "*", "/apis/{group}/{version}/namespaces/{namespace}/{plural}/{name}/{sub}", self._item
        )
        self._runner = web.AppRunner(app, handle_signals=False)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self._host, 0)
        await site.start()
        server = site._server
        assert server is not None
        sockets = getattr(server, "sockets", None) or []
        self.port = sockets[0].getsockname()[1]

    async def _stop_site(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    @property
    def url(self) -> str:
        return f"http://{self._host}:{self.port}"

    def write_kubeconfig(self, path: pathlib.Path, namespace: str = "default") -> pathlib.Path:
        """A kubeconfig (http, no auth) that points the real client at this server."""
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "fake", "cluster": {"server": self.url}}],
            "users": [{"name": "fake", "user": {}}],
            "contexts": [
                {"name": "fake", "context": {"cluster": "fake", "user": "fake", "namespace": namespace}}
            ],
            "current-context": "fake",
        }
        path.write_text(yaml.safe_dump(config))
        return path

    # -- test controls ---------------------------------------------------------------------

    def put(self, obj: Mapping[str, Any]) -> Obj:
        """Create or replace an object (as `kubectl apply` would); returns it as stored."""
        resource = self._resource_of(obj)
        with self._lock:
            return self._write(resource, copy.deepcopy(dict(obj)), keep_status=False)

    def delete(
        self, api_version: str, kind: str, namespace: str, name: str, propagation: str = "Background"
    ) -> bool:
        """Delete as `kubectl delete` would (dependents are garbage-collected per `propagation`)."""
        resource = self._resource_for(api_version, kind)
        with self._lock:
            return self._delete(resource, (namespace, name), propagation)

    def get(self, api_version: str, kind: str, namespace: str, name: str) -> Obj | None:
        resource = self._resource_for(api_version, kind)
        with self._lock:
            obj = self._objects.get(resource, {}).get((namespace, name))
            return copy.deepcopy(obj) if obj is not None else None

    def list(self, api_version: str, kind: str, namespace: str) -> list[Obj]:
        resource = self._resource_for(api_version, kind)
        with self._lock:
            return [
                copy.deepcopy(o) for (ns, _), o in self._objects.get(resource, {}).items() if ns == namespace
            ]

    def compact(self) -> None:
        """Forget all history: a watch from any earlier resourceVersion now gets 410 Gone."""
        with self._lock:
            self._history.clear()
            self._compacted_rv = self._rv + 1

    def drop_watches(self) -> None:
        """Close every open watch stream, as an API server restart or a load balancer would."""
        with self._lock:
            watchers = list(self._watchers)
        for watcher in watchers:
            self._wake(watcher, None)

    def expire_watches(self) -> None:
        """Send an ERROR 410 on every open watch (history expired while watching)."""
        with self._lock:
            watchers = list(self._watchers)
            self._history.clear()
            self._compacted_rv = self._rv + 1
        gone = {"type": "ERROR", "object": _status(410, "Expired", "too old resource version")}
        for watcher in watchers:
            self._wake(watcher, gone)
            self._wake(watcher, None)

    def bookmark(self) -> str:
        """Send a BOOKMARK with the current resourceVersion to every watch; returns that RV."""
        with self._lock:
            self._rv += 1
            rv = str(self._rv)
            watchers = list(self._watchers)
        for watcher in watchers:
            group, version, plural = watcher.resource
            event = {
                "type": "BOOKMARK",
                "object": {
                    "apiVersion": f"{group}/{version}" if group else version,
                    "kind": KINDS.get(plural, plural),
                    "metadata": {"resourceVersion": rv},
                },
            }
            self._wake(watcher, event)
        return rv

    @property
    def open_watches(self) -> int:
        with self._lock:
            return len(self._watchers)

    @property
    def resource_version(self) -> str:
        with self._lock:
            return str(self._rv)

    # -- state (callers hold the lock) -----------------------------------------------------

    @staticmethod
    def _resource_for(api_version: str, kind: str) -> ResourceKey:
        group, _, version = api_version.rpartition("/")
        plurals = {v: k for k, v in KINDS.items()}
        plural = plurals.get(kind, kind.lower() + "s")
        return (group, version, plural)

    def _resource_of(self, obj: Mapping[str, Any]) -> ResourceKey:
        return self._resource_for(str(obj["apiVersion"]), str(obj["kind"]))

    def _write(self, resource: ResourceKey, obj: Obj, *, keep_status: bool) -> Obj:
        meta = obj.setdefault("metadata", {})
        key = (meta.setdefault("namespace", "default"), meta["name"])
        store = self._objects.setdefault(resource, {})
        old = store.get(key)
        if old is None:
            meta.setdefault("uid", str(uuid.uuid4()))
            meta.setdefault("creationTimestamp", _now_rfc3339())
            meta["generation"] = 1
        else:
            old_meta = old["metadata"]
            meta["uid"] = old_meta["uid"]
            meta["creationTimestamp"] = old_meta["creationTimestamp"]
            spec_changed = old.get("spec") != obj.get("spec")
            meta["generation"] = old_meta.get("generation", 1) + (1 if spec_changed else 0)
            if keep_status and "status" in old:
                obj["status"] = old["status"]
        self._rv += 1
        meta["resourceVersion"] = str(self._rv)
        group, version, _ = resource
        obj.setdefault("apiVersion", f"{group}/{version}" if group else version)
        store[key] = obj
        self._record(resource, "ADDED" if old is None else "MODIFIED", obj)
        return copy.deepcopy(obj)

    def _remove(self, resource: ResourceKey, key: ObjectKey) -> bool:
        obj = self._objects.get(resource, {}).pop(key, None)
        if obj is None:
            return False
        self._rv += 1
        obj["metadata"]["resourceVersion"] = str(self._rv)
        self._record(resource, "DELETED", obj)
        return True

    def _delete(self, resource: ResourceKey, key: ObjectKey, propagation: str) -> bool:
        current = self._objects.get(resource, {}).get(key)
        if current is None:
            return False
        uid = str(current["metadata"]["uid"])
        if propagation == "Orphan":
            self._remove(resource, key)
            self._orphan_dependents(key[0], uid)
        elif propagation == "Foreground":
            marked = copy.deepcopy(current)
            marked["metadata"]["deletionTimestamp"] = _now_rfc3339()
            finalizers = marked["metadata"].setdefault("finalizers", [])
            if "foregroundDeletion" not in finalizers:
                finalizers.append("foregroundDeletion")
            self._write(resource, marked, keep_status=True)
            self._after_delete(lambda: self._collect_then_remove(resource, key, uid))
        else:
            self._remove(resource, key)
            self._after_delete(lambda: self._collect(key[0], uid))
        return True

    def _after_delete(self, collect: Callable[[], None]) -> None:
        """Run the collector after the delete has answered, as the real one runs apart from it."""
        loop = self._loop
        if loop is None:
            collect()
            return

        def locked() -> None:
            with self._lock:
                collect()

        loop.call_soon_threadsafe(locked)

    def _dependents(
        self, namespace: str, owner_uid: str
    ) -> builtins.list[tuple[ResourceKey, ObjectKey, Obj]]:  # `list` is also a method here
        return [
            (resource, key, obj)
            for resource, store in self._objects.items()
            for key, obj in list(store.items())
            if key[0] == namespace
            and any(r.get("uid") == owner_uid for r in obj["metadata"].get("ownerReferences") or [])
        ]

    def _collect(self, namespace: str, owner_uid: str) -> None:
        """Delete `owner_uid`'s dependents that have no other live owner (caller holds the lock)."""
        live = {
            str(obj["metadata"]["uid"])
            for store in self._objects.values()
            for (ns, _), obj in store.items()
            if ns == namespace
        }
        for resource, key, obj in self._dependents(namespace, owner_uid):
            refs = obj["metadata"].get("ownerReferences") or []
            if any(r.get("uid") in live for r in refs if r.get("uid") != owner_uid):
                self._drop_owner_reference(resource, obj, owner_uid)
            elif self._remove(resource, key):
                self._collect(namespace, str(obj["metadata"]["uid"]))

    def _collect_then_remove(self, resource: ResourceKey, key: ObjectKey, owner_uid: str) -> None:
        self._collect(key[0], owner_uid)
        self._remove(resource, key)

    def _orphan_dependents(self, namespace: str, owner_uid: str) -> None:
        for resource, _, obj in self._dependents(namespace, owner_uid):
            self._drop_owner_reference(resource, obj, owner_uid)

    def _drop_owner_reference(self, resource: ResourceKey, obj: Obj, owner_uid: str) -> None:
        updated = copy.deepcopy(obj)
        refs = [r for r in updated["metadata"].get("ownerReferences") or [] if r.get("uid") != owner_uid]
        if refs:
            updated["metadata"]["ownerReferences"] = refs
        else:
            updated["metadata"].pop("ownerReferences", None)
        self._write(resource, updated, keep_status=True)

    def _record(self, resource: ResourceKey, event_type: str, obj: Obj) -> None:
        snapshot = copy.deepcopy(obj)
        self._history.append((self._rv, resource, event_type, snapshot))
        for watcher in self._watchers:
            if (
                watcher.resource == resource
                and snapshot["metadata"]["namespace"] == watcher.namespace
                and _matches(snapshot, watcher.label_selector, watcher.field_selector)
            ):
                self._wake(watcher, {"type": event_type, "object": snapshot})

    def _wake(self, watcher: _Watcher, event: Obj | None) -> None:
        loop = self._loop
        if loop is not None:
            loop.call_soon_threadsafe(watcher.queue.put_nowait, event)

    # -- HTTP ------------------------------------------------------------------------------

    def _route(self, request: web.Request) -> tuple[ResourceKey, str]:
        info = request.match_info
        return (info.get("group", ""), info["version"], info["plural"]), info["namespace"]

    def _log_call(self, resource: ResourceKey, verb: str, sub: str = "") -> None:
        with self._lock:
            self.calls.append(ApiCall(resource[0], resource[2] + (f"/{sub}" if sub else ""), verb))

    async def _collection(self, request: web.Request) -> web.StreamResponse:
        resource, namespace = self._route(request)
        if request.method == "GET":
            query = request.query
            labels = _parse_selector(query.get("labelSelector", ""))
            fields = _parse_selector(query.get("fieldSelector", ""))
            if query.get("watch") in ("true", "1"):
                self._log_call(resource, "watch")
                return await self._watch(request, resource, namespace, labels, fields)
            self._log_call(resource, "list")
            with self._lock:
                items = [
                    copy.deepcopy(o)
                    for (ns, _), o in sorted(self._objects.get(resource, {}).items())
                    if ns == namespace and _matches(o, labels, fields)
                ]
                rv = str(self._rv)
            group, version, plural = resource
            return web.json_response(
                {
                    "apiVersion": f"{group}/{version}" if group else version,
                    "kind": KINDS.get(plural, plural) + "List",
                    "metadata": {"resourceVersion": rv},
                    "items": items,
                }
            )
        if request.method == "POST":
            self._log_call(resource, "create")
            body = await request.json()
            body.setdefault("metadata", {})["namespace"] = namespace
            meta = body["metadata"]
            if not meta.get("name") and meta.get("generateName"):
                meta["name"] = meta["generateName"] + uuid.uuid4().hex[:5]
            with self._lock:
                if (namespace, meta.get("name")) in self._objects.get(resource, {}):
                    return _error(409, "AlreadyExists", f"{resource[2]} {meta.get('name')!r} already exists")
                body.get("metadata", {}).pop("resourceVersion", None)
                stored = self._write(resource, body, keep_status=False)
            return web.json_response(stored, status=201)
        return _error(405, "MethodNotAllowed", request.method)

    async def _item(self, request: web.Request) -> web.StreamResponse:
        resource, namespace = self._route(request)
        name = request.match_info["name"]
        sub = request.match_info.get("sub", "")
        if sub not in ("", "status"):
            return _error(404, "NotFound", f"subresource {sub!r}")
        key = (namespace, name)
        verbs = {"GET": "get", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}
        verb = verbs.get(request.method)
        if verb is None:
            return _error(405, "MethodNotAllowed", request.method)
        self._log_call(resource, verb, sub)
        body = await request.json() if request.method in ("PUT", "PATCH") or request.can_read_body else None
        with self._lock:
            current = self._objects.get(resource, {}).get(key)
            if current is None:
                return _error(404, "NotFound", f'{resource[2]} "{name}" not found')
            if verb == "get":
                return web.json_response(copy.deepcopy(current))
            if verb == "delete":
                propagation = request.query.get("propagationPolicy") or str(
                    (body or {}).get("propagationPolicy") or "Background"
                )
                if propagation not in ("Background", "Foreground", "Orphan"):
                    return _error(400, "BadRequest", f"unsupported propagationPolicy {propagation!r}")
                self._delete(resource, key, propagation)
                return web.json_response(_status(200, "", "deleted") | {"status": "Success"})
            wanted_rv = ((body or {}).get("metadata") or {}).get("resourceVersion")
            if wanted_rv and wanted_rv != current["metadata"]["resourceVersion"]:
                return _error(
                    409,
                    "Conflict",
                    f'Operation cannot be fulfilled on {resource[2]} "{name}": '
                    "the object has been modified; please apply your changes to the latest version",
                )
            if verb == "patch":
                content_type = request.headers.get("Content-Type", "")
                if "merge-patch" not in content_type:
                    return _error(415, "UnsupportedMediaType", content_type)
                if sub == "status":
                    updated = copy.deepcopy(current)
                    updated["status"] = _merge_patch(current.get("status"), (body or {}).get("status"))
                else:
                    body = dict(body or {})
                    body.pop("status", None)
                    updated = _merge_patch(current, body)
                    updated["status"] = copy.deepcopy(current.get("status"))
                    if updated["status"] is None:
                        updated.pop("status")
            else:
                assert isinstance(body, dict)
                if sub == "status":
                    updated = copy.deepcopy(current)
                    updated["status"] = body.get("status")
                else:
                    updated = body
            updated.setdefault("metadata", {})["namespace"] = namespace
            updated["metadata"]["name"] = name
            stored = self._write(resource, updated, keep_status=sub == "" and verb == "update")
        return web.json_response(stored)

    async def _watch(
        self,
        request: web.Request,
        resource: ResourceKey,
        namespace: str,
        labels: dict[str, str],
        fields: dict[str, str],
    ) -> web.StreamResponse:
        query = request.query
        timeout_s = float(query.get("timeoutSeconds", "1800"))
        bookmarks = query.get("allowWatchBookmarks") in ("true", "1")
        watcher = _Watcher(resource, namespace, labels, fields)
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        await response.prepare(request)
        with self._lock:
            since_raw = query.get("resourceVersion", "")
            since = int(since_raw) if since_raw.isdigit() else 0
            if since_raw in ("", "0"):
                # "Any": start with the current state as ADDED events, as the API server does.
                initial: list[Obj] = [
                    {"type": "ADDED", "object": copy.deepcopy(o)}
                    for (ns, _), o in sorted(self._objects.get(resource, {}).items())
                    if ns == namespace and _matches(o, labels, fields)
                ]
            elif since < self._compacted_rv - 1:
                initial = [{"type": "ERROR", "object": _status(410, "Expired", "too old resource version")}]
            else:
                initial = [
                    {"type": event_type, "object": copy.deepcopy(obj)}
                    for rv, res, event_type, obj in self._history
                    if rv > since
                    and res == resource
                    and obj["metadata"]["namespace"] == namespace
                    and _matches(obj, labels, fields)
                ]
            self._watchers.append(watcher)
        try:
            for first in initial:
                await response.write(json.dumps(first).encode() + b"\n")
                if first["type"] == "ERROR":
                    return response
            deadline = asyncio.get_running_loop().time() + timeout_s
            while True:
                remaining = deadline - asyncio.get_running_loop().time()
                if remaining <= 0:
                    break
                try:
                    event: Obj | None = await asyncio.wait_for(watcher.queue.get(), remaining)
                except TimeoutError:
                    break
                if event is None:
                    # Drop the connection without a clean end, as a dying server does.
                    transport = request.transport
                    if transport is not None:
                        transport.abort()
                    return response
                if event["type"] == "BOOKMARK" and not bookmarks:
                    continue
                await response.write(json.dumps(event).encode() + b"\n")
                if event["type"] == "BOOKMARK":
                    with self._lock:
                        self.bookmarks_sent += 1
                if event["type"] == "ERROR":
                    return response
            await response.write_eof()
        except (ConnectionResetError, asyncio.CancelledError):
            pass
        finally:
            with self._lock:
                if watcher in self._watchers:
                    self._watchers.remove(watcher)
        return response
