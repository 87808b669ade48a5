"""The EPP's watches against a real API server that restarts under them.

A restarted kube-apiserver drops every watch and starts its watch cache over from etcd's
current revision; with etcd compacted past the watch's resourceVersion, the resumed watch is
answered 410 Gone however the API server serves it: the EPP relists, and what changed while
it was not watching is in its pool, with no pod lost or duplicated. While the API server is
down, the EPP keeps routing to the pods it knew. The watches also take the API server's
bookmarks.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from epp.kube.watch import KubeSource, PoolRef
from epp.picker.datastore.store import Datastore
from testkit.localcluster import LocalCluster, dump
from testkit.waiting import eventually, wait_until
from tests.support.kube_source import running_source

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(300)]

NAMESPACE = "watch"
POOL = "pool-w"
NODE = "kwok-node-0"


def pool() -> dict[str, Any]:
    return {
        "apiVersion": "inference.networking.k8s.io/v1",
        "kind": "InferencePool",
        "metadata": {"name": POOL},
        "spec": {
            "selector": {"matchLabels": {"app": "watched"}},
            "targetPorts": [{"number": 8000}],
            "endpointPickerRef": {"name": "epp", "port": {"number": 9002}},
        },
    }


def pod(name: str) -> dict[str, Any]:
    """A Pod on the kwok node: kwok runs it (Running, Ready, an IP) without a container."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": "watched"}},
        "spec": {"nodeName": NODE, "containers": [{"name": "vllm", "image": "vllm/vllm-openai"}]},
    }


@pytest.fixture(scope="module")
def namespace(cluster: LocalCluster) -> Iterator[str]:
    cluster.kubectl("create", "namespace", NAMESPACE)
    cluster.apply(dump([pool()]), "-n", NAMESPACE)
    yield NAMESPACE
    cluster.kubectl("delete", "namespace", NAMESPACE, "--wait=false")


def ready_addresses(cluster: LocalCluster) -> set[str]:
    """host:port of every Ready pod of the pool, as the API server has them."""
    addresses = set()
    for item in cluster.get("pods", "-n", NAMESPACE, "-l", "app=watched")["items"]:
        status = item.get("status", {})
        ready = any(c["type"] == "Ready" and c["status"] == "True" for c in status.get("conditions", []))
        if ready and status.get("podIP") and not item["metadata"].get("deletionTimestamp"):
            addresses.add(f"{status['podIP']}:8000")
    return addresses


def routable(datastore: Datastore) -> list[str]:
    return sorted(state.address for state in datastore.snapshot().endpoints)


def watching(
    cluster: LocalCluster, *, watch_timeout_s: int = 30
) -> contextlib.AbstractAsyncContextManager[tuple[Datastore, KubeSource]]:
    pool = PoolRef(name=POOL, namespace=NAMESPACE, group="inference.networking.k8s.io")
    return running_source(pool, str(cluster.kubeconfig), watch_timeout_s=watch_timeout_s, synced_within_s=20)


async def test_an_api_server_restart_mid_watch_relists_and_loses_nothing(
    cluster: LocalCluster, namespace: str, caplog: pytest.LogCaptureFixture
) -> None:
    cluster.apply(dump([pod("a"), pod("b")]), "-n", namespace)
    await eventually(lambda: len(ready_addresses(cluster)) == 2, "kwok runs both pods", within_s=30)
    async with watching(cluster) as (datastore, _):
        await eventually(
            lambda: set(routable(datastore)) == ready_addresses(cluster), "both routable", within_s=10
        )
        # With the API server down (no bookmark can move the watch on), etcd is compacted past
        # every resourceVersion handed out: whether the restarted API server serves the resumed
        # watch from its new watch cache or, while that fills, from etcd, it is gone.
        caplog.set_level(logging.INFO, logger="epp.kube.watch")
        await asyncio.to_thread(cluster.restart_apiserver, while_down=cluster.etcd_compact)
        cluster.kubectl("delete", "pod", "a", "-n", namespace, "--wait=false")
        cluster.apply(dump([pod("c")]), "-n", namespace)
        await eventually(
            lambda: (
                {p.name for p in datastore.pods()} >= {"b", "c"}
                and "a" not in {p.name for p in datastore.pods()}
            ),
            "the restart's changes seen",
            within_s=30,
        )
        await eventually(
            lambda: set(routable(datastore)) == ready_addresses(cluster), "b and c routable", within_s=30
        )
        addresses = routable(datastore)
        assert len(addresses) == len(set(addresses)) == 2, addresses  # none lost, none twice
        assert "watch expired, relisting" in caplog.text, "a 410 Gone answered with a relist"


async def test_the_watches_take_bookmarks(cluster: LocalCluster, namespace: str) -> None:
    # The API server sends a bookmark shortly before a watch's timeout, and about once a minute.
    async with watching(cluster, watch_timeout_s=10) as (_, source):
        await eventually(lambda: source.bookmarks > 0, "a bookmark from the API server", within_s=70)


async def test_an_api_server_outage_keeps_routing_on_the_last_known_pool(
    cluster: LocalCluster, namespace: str, caplog: pytest.LogCaptureFixture
) -> None:
    """kube-apiserver stopped under the EPP's watches: every re-watch fails, and the EPP keeps
    routing to the pods it knew; once the API server is back, a change made then is seen."""
    cluster.apply(dump([pod("outage-a")]), "-n", namespace)
    await eventually(lambda: any(True for _ in ready_addresses(cluster)), "a ready pod", within_s=30)
    caplog.set_level(logging.WARNING, logger="epp.kube.watch")
    async with watching(cluster) as (datastore, _):
        await eventually(
            lambda: set(routable(datastore)) == ready_addresses(cluster), "the pool routable", within_s=10
        )
        known = routable(datastore)
        loop = asyncio.get_running_loop()

        def during_outage() -> None:
            """(In the restart's thread.) Wait for the EPP's re-watches to fail, a few times,
            and check what it routes to on its own loop meanwhile."""

            def failed_rewatches() -> int:
                return caplog.text.count("watch failed, retrying")

            wait_until(lambda: failed_rewatches() >= 3, "the EPP's re-watches failing", within_s=30)
            routed = asyncio.run_coroutine_threadsafe(_on_loop(lambda: routable(datastore)), loop).result(10)
            assert routed == known, "the EPP dropped what it knew while the API server was down"

        await asyncio.to_thread(cluster.restart_apiserver, while_down=during_outage)
        cluster.apply(dump([pod("outage-b")]), "-n", namespace)
        await eventually(
            lambda: "outage-b" in {p.name for p in datastore.pods()},
            "a pod made after the outage",
            within_s=30,
        )


async def _on_loop(read: Callable[[], list[str]]) -> list[str]:
    return read()
