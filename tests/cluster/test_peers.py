"""Active-active replicas that find each other through the Kubernetes API, on a real control plane.

The chart rendered with `inferenceExtension.activeActive.enabled` (plaintext peer port) is applied
with its Deployment: kube-scheduler puts the replicas' Pods on the kwok node and kwok gives them
IPs. One `epp serve` per Pod then runs with the Deployment's own arguments
(`--peer-selector=<the Deployment's selector>`) bound to the Pod's IP, as the chart's
ServiceAccount: each replica lists the Pods through the API, finds the others and exchanges
batches with them; scaled to three, every replica finds the new one. Nothing is denied.

(Not through a Service's EndpointSlices: the API server refuses loopback addresses in them, and
the local control plane's Pod IPs are on loopback.)
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from epp.tools.localstack import free_ports
from testkit.localcluster import LocalCluster, dump
from testkit.waiting import wait_until
from tests.cluster.chart import Chart, render

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(300)]

NAMESPACE = "peers"
PEER_PORT = 9004


@dataclass
class Replica:
    pod: str
    ip: str
    metrics_port: int
    process: subprocess.Popen[bytes]
    log_path: pathlib.Path

    def peers(self) -> dict[str, Any]:
        url = f"http://{self.ip}:{self.metrics_port}/debug/peers"
        with urllib.request.urlopen(url, timeout=5) as response:
            page: dict[str, Any] = json.load(response)
        return page

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


class Replicas:
    """One `epp serve` per Pod of the chart's EPP Deployment, as its ServiceAccount."""

    def __init__(self, cluster: LocalCluster, chart: Chart, workdir: pathlib.Path) -> None:
        self._cluster = cluster
        self.chart = chart
        self._workdir = workdir
        self._kubeconfig = cluster.token_kubeconfig(
            chart.namespace, chart.service_account, workdir / "sa.kubeconfig"
        )
        self.running: dict[str, Replica] = {}

    def pod_ips(self) -> dict[str, str]:
        pods = self._cluster.get(
            "pods", "-n", self.chart.namespace, "-l", "app.kubernetes.io/instance=rbac-epp"
        )
        return {
            p["metadata"]["name"]: p["status"]["podIP"]
            for p in pods["items"]
            if p.get("status", {}).get("podIP") and not p["metadata"].get("deletionTimestamp")
        }

    def start_every_pod(self) -> None:
        for pod, ip in self.pod_ips().items():
            if pod not in self.running:
                self._start(pod, ip)

    def _start(self, pod: str, ip: str) -> None:
        ports = free_ports(3)
        log_path = self._workdir / f"{pod}.log"
        env = {**os.environ, "POD_NAMESPACE": self.chart.namespace, "POD_NAME": pod}
        with log_path.open("wb") as log:
            process = subprocess.Popen(
                [
                    *(sys.executable, "-m", "epp", *self.chart.serve_args(ports)),
                    *(f"--kubeconfig={self._kubeconfig}", f"--host={ip}"),
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
            )
        self.running[pod] = Replica(pod, ip, ports[2], process, log_path)

    def stop(self) -> None:
        for replica in self.running.values():
            replica.process.terminate()
        for replica in self.running.values():
            try:
                replica.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                replica.process.kill()


@pytest.fixture(scope="module")
def replicas(cluster: LocalCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Replicas]:
    cluster.kubectl("create", "namespace", NAMESPACE)
    chart = Chart(NAMESPACE, render(NAMESPACE, activeActive={"enabled": True, "tls": {"insecure": True}}))
    deployment = next(o for o in chart.objects if o["kind"] == "Deployment")
    cluster.apply(dump([*chart.applied(), deployment]), "-n", NAMESPACE)
    running = Replicas(cluster, chart, tmp_path_factory.mktemp("peers"))
    try:
        yield running
    finally:
        running.stop()
        cluster.kubectl("delete", "namespace", NAMESPACE, "--wait=false")


def _everyone_heard_from_everyone(replicas: Replicas) -> bool:
    """Each replica sends to exactly the others' Pod IPs, and has heard from each of them."""
    members = list(replicas.running.values())
    for replica in members:
        try:
            page = replica.peers()
        except OSError:  # still starting
            return False
        others = sorted(f"{r.ip}:{PEER_PORT}" for r in members if r is not replica)
        if sorted(page["sending_to"]) != others or len(page["peers"]) != len(others):
            return False
    return True


def test_replicas_find_each_other_by_their_pod_labels_through_the_api(
    cluster: LocalCluster, replicas: Replicas
) -> None:
    assert any(a.startswith("--peer-selector=") for a in replicas.chart.serve_args([1, 2, 3]))
    wait_until(lambda: len(replicas.pod_ips()) == 2, "two EPP Pods with IPs", within_s=60)
    replicas.start_every_pod()
    wait_until(lambda: _everyone_heard_from_everyone(replicas), "two replicas exchanging", within_s=60)

    cluster.kubectl("scale", "deployment", "rbac-epp", "-n", NAMESPACE, "--replicas=3")
    wait_until(lambda: len(replicas.pod_ips()) == 3, "a third EPP Pod with an IP", within_s=60)
    replicas.start_every_pod()
    # Each replica lists the EndpointSlices again every 5 s.
    wait_until(lambda: _everyone_heard_from_everyone(replicas), "three replicas exchanging", within_s=30)
    for replica in replicas.running.values():
        assert "forbidden" not in replica.log().lower(), replica.log()
