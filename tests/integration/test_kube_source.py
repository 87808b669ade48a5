"""The real `KubeSource` against an API server (the fake one, or a cluster with `--kube-real`).

Each test changes objects through the API and waits (bounded) for the datastore to show
what a user would expect: which pods are routable, which models are served, what status
and Events the EPP wrote.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import json
import sys
from typing import Any

import pytest

from epp.kube.watch import API_CALLS, KubeSource, PoolRef
from epp.picker.datastore.store import Datastore
from testkit.waiting import eventually
from tests.fakekube.plugin import KubeEnv, needs_fake
from tests.support.kube_source import running_source

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

POOL_NAME = "pool-a"
POOL_API = "inference.networking.k8s.io/v1"
MODEL_API = "inference.networking.x-k8s.io/v1alpha2"
ROUTABLE_WITHIN_S = 1.0


def pool(env: KubeEnv, selector: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "apiVersion": POOL_API,
        "kind": "InferencePool",
        "metadata": {"name": POOL_NAME, "namespace": env.namespace},
        "spec": {
            "selector": {"matchLabels": selector or {"app": "vllm"}},
            "targetPorts": [{"number": 8000}],
            "endpointPickerRef": {"name": "epp", "port": {"number": 9002}},
        },
    }


def pod(
    env: KubeEnv, name: str, ip: str, *, ready: bool = True, labels: dict[str, str] | None = None
) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": env.namespace, "labels": labels or {"app": "vllm"}},
        # Bound to a node that does not exist: on a real cluster no kubelet runs it or rewrites
        # its status, so the test's Ready condition stands.
        "spec": {
            "nodeName": "epp-test-no-such-node",
            "containers": [{"name": "vllm", "image": "vllm/vllm-openai"}],
        },
        "status": {
            "podIP": ip,
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        },
    }


def model(env: KubeEnv, name: str, model_name: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": MODEL_API,
        "kind": "InferenceModel",
        "metadata": {"name": name, "namespace": env.namespace},
        "spec": {"modelName": model_name, "poolRef": {"name": POOL_NAME}, **spec},
    }


def addresses(datastore: Datastore) -> set[str]:
    return {state.address for state in datastore.snapshot().endpoints}


def running(
    env: KubeEnv, **kwargs: Any
) -> contextlib.AbstractAsyncContextManager[tuple[Datastore, KubeSource]]:
    group = kwargs.pop("pool_group", "inference.networking.k8s.io")
    return running_source(
        PoolRef(name=POOL_NAME, namespace=env.namespace, group=group),
        env.kubeconfig,
        watch_timeout_s=kwargs.pop("watch_timeout_s", 2),
        synced_within_s=10,
        **kwargs,
    )


async def test_ready_pod_becomes_routable_and_leaves_when_deleted_or_unready(kube: KubeEnv) -> None:
    kube.put(pool(kube))
    async with running(kube) as (datastore, _):
        assert addresses(datastore) == set()
        kube.put(pod(kube, "vllm-0", "10.0.0.1"))
        await eventually(
            lambda: addresses(datastore) == {"10.0.0.1:8000"}, "pod routable", within_s=ROUTABLE_WITHIN_S
        )
        kube.put(pod(kube, "vllm-1", "10.0.0.2", ready=False))
        kube.put(pod(kube, "vllm-0", "10.0.0.1", ready=False))
        await eventually(
            lambda: addresses(datastore) == set(), "unready pod gone", within_s=ROUTABLE_WITHIN_S
        )
        kube.put(pod(kube, "vllm-1", "10.0.0.2"))
        await eventually(
            lambda: addresses(datastore) == {"10.0.0.2:8000"}, "second ready", within_s=ROUTABLE_WITHIN_S
        )
        kube.delete("v1", "Pod", kube.namespace, "vllm-1")
        await eventually(
            lambda: addresses(datastore) == set(), "deleted pod gone", within_s=ROUTABLE_WITHIN_S
        )


async def test_pods_outside_the_selector_are_ignored_until_the_selector_changes(kube: KubeEnv) -> None:
    kube.put(pool(kube))
    kube.put(pod(kube, "a", "10.0.0.1"))
    kube.put(pod(kube, "b", "10.0.0.2", labels={"app": "other"}))
    async with running(kube) as (datastore, _):
        assert addresses(datastore) == {"10.0.0.1:8000"}
        kube.put(pool(kube, selector={"app": "other"}))
        await eventually(
            lambda: addresses(datastore) == {"10.0.0.2:8000"}, "resync to new selector", within_s=5.0
        )


@pytest.mark.fake_kube(
    reason="sends a 410 ERROR event on every open watch on demand (the real API server does so "
    "only when its watch cache falls behind; an expired resourceVersion at re-watch is in "
    "tests/cluster/test_watch.py)"
)
async def test_a_410_error_event_on_an_open_watch_relists(kube: KubeEnv) -> None:
    fake = needs_fake(kube)
    kube.put(pool(kube))
    kube.put(pod(kube, "a", "10.0.0.1"))
    async with running(kube) as (datastore, _):
        assert addresses(datastore) == {"10.0.0.1:8000"}
        fake.expire_watches()  # a 410 ERROR event on open watches
        kube.put(pod(kube, "c", "10.0.0.3"))
        await eventually(
            lambda: addresses(datastore) == {"10.0.0.1:8000", "10.0.0.3:8000"},
            "relist after ERROR 410",
            within_s=5.0,
        )


@pytest.mark.fake_kube(reason="counts the watches open and sends a bookmark on demand")
async def test_bookmarks_advance_the_resource_version(kube: KubeEnv) -> None:
    fake = needs_fake(kube)
    kube.put(pool(kube))
    kube.put(pod(kube, "a", "10.0.0.1"))
    async with running(kube) as (datastore, _):
        await eventually(lambda: fake.open_watches >= 4, "watches open", within_s=5.0)
        watches = fake.open_watches
        bookmark_rv = fake.bookmark()
        await eventually(
            lambda: fake.bookmarks_sent >= watches, "the bookmark reaches the watchers", within_s=5.0
        )
        fake.compact()  # history before the bookmark is gone; a watch from an older RV would 410
        list_calls_before = sum(1 for call in fake.calls if call.verb == "list")
        fake.drop_watches()
        kube.put(pod(kube, "b", "10.0.0.2"))
        await eventually(
            lambda: addresses(datastore) == {"10.0.0.1:8000", "10.0.0.2:8000"}, "new pod", within_s=5.0
        )
        watches_from_bookmark = [c for c in fake.calls if c.verb == "watch"]
        assert watches_from_bookmark
        assert sum(1 for call in fake.calls if call.verb == "list") == list_calls_before, (
            f"re-watched from bookmark {bookmark_rv} without relisting"
        )


async def test_model_name_conflict_writes_accepted_and_model_name_in_use(kube: KubeEnv) -> None:
    kube.put(pool(kube))
    pending = {
        "type": "Ready",
        "status": "Unknown",
        "reason": "Pending",
        "message": "",
        "lastTransitionTime": "2026-01-01T00:00:00Z",
    }
    first = kube.put(model(kube, "older", "llama") | {"status": {"conditions": [pending]}})
    created = first["metadata"]["creationTimestamp"]
    # creationTimestamp has one-second resolution: the newer one must be created in a later second.
    await eventually(lambda: _rfc3339_now() > created, "the next second", within_s=2.0)
    kube.put(model(kube, "newer", "llama"))

    def condition(name: str) -> dict[str, Any] | None:
        obj = kube.get(MODEL_API, "InferenceModel", kube.namespace, name) or {}
        conditions = (obj.get("status") or {}).get("conditions") or []
        return next((c for c in conditions if c.get("type") == "Accepted"), None)

    async with running(kube) as (datastore, _):
        await eventually(
            lambda: condition("older") is not None and condition("newer") is not None, "status", within_s=5.0
        )
        older, newer = condition("older"), condition("newer")
        assert older is not None and newer is not None
        assert (older["status"], older["reason"]) == ("True", "Accepted")
        assert (newer["status"], newer["reason"]) == ("False", "ModelNameInUse")
        assert datastore.snapshot().models["llama"].name == "older"
        older_obj = kube.get(MODEL_API, "InferenceModel", kube.namespace, "older") or {}
        assert pending in older_obj["status"]["conditions"], "other condition types are kept"
        rv_before = (kube.get(MODEL_API, "InferenceModel", kube.namespace, "older") or {})["metadata"][
            "resourceVersion"
        ]
        # Another model's arrival makes the source write statuses again; once it has its own, that
        # pass is over, and "older" must not have been written again.
        kube.put(model(kube, "other", "mistral"))
        await eventually(lambda: condition("other") is not None, "the next status pass", within_s=5.0)
        rv_after = (kube.get(MODEL_API, "InferenceModel", kube.namespace, "older") or {})["metadata"][
            "resourceVersion"
        ]
        assert rv_after == rv_before, "status is patched only when it changes"
        kube.delete(MODEL_API, "InferenceModel", kube.namespace, "older")
        await eventually(
            lambda: (condition("newer") or {}).get("status") == "True", "newer takes over", within_s=5.0
        )


@pytest.mark.fake_kube(
    reason="stores an object our CRDs refuse at admission, as a cluster with an older CRD would"
)
async def test_invalid_object_emits_an_event_and_keeps_the_last_good_state(kube: KubeEnv) -> None:
    kube.put(pool(kube))
    kube.put(model(kube, "chat", "llama", targetModels=[{"name": "a", "weight": 10}]))
    async with running(kube) as (datastore, _):
        await eventually(lambda: "llama" in datastore.snapshot().models, "model served", within_s=5.0)
        bad = kube.put(
            model(kube, "chat", "llama", targetModels=[{"name": "a", "weight": 10}, {"name": "b"}])
        )

        def events() -> list[dict[str, Any]]:
            return [
                e
                for e in kube.list("v1", "Event", kube.namespace)
                if (e.get("involvedObject") or e.get("involved_object") or {}).get("name") == "chat"
            ]

        await eventually(lambda: bool(events()), "event emitted", within_s=5.0)
        event = events()[0]
        involved = event.get("involvedObject") or event.get("involved_object") or {}
        assert involved["kind"] == "InferenceModel"
        assert involved["uid"] == bad["metadata"]["uid"]
        assert event["type"] == "Warning"
        assert "weight" in event["message"]
        served = datastore.snapshot().models["llama"]
        assert [t.name for t in served.target_models] == ["a"], "last good spec kept"


async def test_pool_deleted_clears_endpoints_and_returning_pool_restores_them(kube: KubeEnv) -> None:
    kube.put(pool(kube))
    kube.put(pod(kube, "a", "10.0.0.1"))
    async with running(kube) as (datastore, _):
        assert addresses(datastore) == {"10.0.0.1:8000"}
        kube.delete(POOL_API, "InferencePool", kube.namespace, POOL_NAME)
        await eventually(
            lambda: datastore.pool is None and addresses(datastore) == set(), "pool gone", within_s=5.0
        )
        kube.put(pool(kube))
        await eventually(lambda: addresses(datastore) == {"10.0.0.1:8000"}, "pool back", within_s=5.0)


async def test_x_k8s_v1alpha2_pool_group(kube: KubeEnv) -> None:
    kube.put(
        {
            "apiVersion": "inference.networking.x-k8s.io/v1alpha2",
            "kind": "InferencePool",
            "metadata": {"name": POOL_NAME, "namespace": kube.namespace},
            "spec": {"selector": {"app": "vllm"}, "targetPortNumber": 8001, "extensionRef": {"name": "epp"}},
        }
    )
    kube.put(pool(kube, selector={"app": "v1-only"}))  # same name in the v1 group: not ours
    kube.put(pod(kube, "a", "10.0.0.1"))
    async with running(kube, pool_group="inference.networking.x-k8s.io") as (datastore, _):
        assert datastore.pool is not None and datastore.pool.group == "inference.networking.x-k8s.io"
        assert addresses(datastore) == {"10.0.0.1:8001"}


@pytest.mark.fake_kube(
    reason="stores an object our CRDs refuse at admission, as a cluster with an older CRD would"
)
async def test_invalid_pool_update_keeps_the_last_good_pool(kube: KubeEnv) -> None:
    kube.put(pool(kube))
    kube.put(pod(kube, "a", "10.0.0.1"))
    async with running(kube) as (datastore, _):
        bad = pool(kube)
        bad["spec"]["targetPorts"] = [{"number": 70000}]
        stored = kube.put(bad)

        def rejected() -> bool:
            return any(
                (e.get("involvedObject") or {}).get("uid") == stored["metadata"]["uid"]
                for e in kube.list("v1", "Event", kube.namespace)
            )

        await eventually(rejected, "event for the bad pool", within_s=5.0)
        assert addresses(datastore) == {"10.0.0.1:8000"}
        assert datastore.pool is not None and datastore.pool.target_ports == (8000,)


async def test_objectives_of_this_pool_are_served_and_others_ignored(kube: KubeEnv) -> None:
    def objective(name: str, pool_name: str, priority: int) -> dict[str, Any]:
        return {
            "apiVersion": MODEL_API,
            "kind": "InferenceObjective",
            "metadata": {"name": name, "namespace": kube.namespace},
            "spec": {"priority": priority, "poolRef": {"name": pool_name}},
        }

    kube.put(pool(kube))
    kube.put(objective("batch", POOL_NAME, -1))
    kube.put(objective("elsewhere", "other-pool", 5))
    async with running(kube) as (datastore, _):
        objectives = datastore.snapshot().objectives
        assert set(objectives) == {"batch"} and objectives["batch"].priority == -1
        kube.put(objective("batch", POOL_NAME, 3))
        await eventually(
            lambda: datastore.snapshot().objectives["batch"].priority == 3, "update", within_s=5.0
        )
        kube.delete(MODEL_API, "InferenceObjective", kube.namespace, "batch")
        await eventually(lambda: not datastore.snapshot().objectives, "objective deleted", within_s=5.0)


@pytest.mark.fake_kube(reason="records every call the client made")
async def test_every_api_call_is_in_the_rbac_table(kube: KubeEnv) -> None:
    fake = needs_fake(kube)
    kube.put(pool(kube))
    kube.put(pod(kube, "a", "10.0.0.1"))
    kube.put(model(kube, "m", "llama"))
    kube.put(model(kube, "bad", "x", criticality="Urgent"))
    async with running(kube):
        await eventually(lambda: any(c.resource == "events" for c in fake.calls), "event call", within_s=5.0)
        await eventually(
            lambda: any(c.resource == "inferencemodels/status" for c in fake.calls), "status", within_s=5.0
        )
    seen = {(c.group, c.resource, c.verb) for c in fake.calls}
    assert seen <= API_CALLS


async def test_epp_serve_tracks_a_pod_becoming_ready(kube: KubeEnv) -> None:
    """The console script, configured only by flags and a kubeconfig, routes to a pod once Ready."""
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    kube.put(pool(kube))
    kube.put(pod(kube, "vllm-0", "127.0.0.21", ready=False))
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "epp",
        "serve",
        f"--pool-name={POOL_NAME}",
        f"--pool-namespace={kube.namespace}",
        f"--kubeconfig={kube.kubeconfig}",
        "--secure-serving=false",
        "--host=127.0.0.1",
        "--grpc-port=0",
        "--grpc-health-port=0",
        "--metrics-port=0",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    lines: list[dict[str, Any]] = []

    async def read_logs() -> None:
        assert process.stdout is not None
        async for raw in process.stdout:
            with contextlib.suppress(ValueError):
                lines.append(json.loads(raw))

    reader = asyncio.create_task(read_logs())

    def logged(message: str, **fields: Any) -> dict[str, Any] | None:
        for line in lines:
            if line.get("msg") == message and all(line.get(k) == v for k, v in fields.items()):
                return line
        return None

    try:
        await eventually(lambda: logged("epp serving") is not None, "epp serve started", within_s=20)
        serving = logged("epp serving") or {}
        async with grpc.aio.insecure_channel(f"127.0.0.1:{serving['health_port']}") as channel:
            health = health_pb2_grpc.HealthStub(channel)
            request = health_pb2.HealthCheckRequest(service="readiness")
            # Watch pushes every status change: wait for SERVING (the first sync) as it happens,
            # with a bound only so that a broken build fails instead of hanging.
            async with asyncio.timeout(60):
                async for response in health.Watch(request):
                    if response.status == health_pb2.HealthCheckResponse.SERVING:
                        break
        assert not any("127.0.0.21:8000" in (line.get("endpoints") or []) for line in lines)
        kube.put(pod(kube, "vllm-0", "127.0.0.21"))
        await eventually(
            lambda: any("127.0.0.21:8000" in (line.get("endpoints") or []) for line in lines),
            "endpoint routable within one second",
            within_s=ROUTABLE_WITHIN_S,
        )
    finally:
        if process.returncode is None:
            process.terminate()
            try:
                await asyncio.wait_for(process.wait(), 15)
            except TimeoutError:
                process.kill()
                await process.wait()
        reader.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await reader
    assert process.returncode == 0, lines[-5:]


def _rfc3339_now() -> str:
    """Now, at the API server's one-second resolution (creationTimestamp's format)."""
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
