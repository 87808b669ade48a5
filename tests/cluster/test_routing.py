"""Envoy → `epp serve` (Kubernetes source) → simulated model servers that are real Pods.

The Pods come from `manifests/sim/deployment.yaml`, scheduled by kube-scheduler onto the kwok
node, Ready by kwok, each with a 127.1.x IP on which `PodLauncher` runs the Pod's own container
arguments (`epp sim ...`). The pool and models are `manifests/samples/`. What a user sees:

- every request is answered 200 by one of the Deployment's Pods;
- `kubectl scale` up: the new Pod is in the EPP's pool within seconds and gets requests;
  down: the Pods gone leave the pool within seconds and every request still succeeds.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import yaml

from epp.tools.envoy.bootstrap import EnvoyOptions, HostPort, Upstream, build_bootstrap, render_yaml
from epp.tools.envoy.process import EnvoyProcess
from epp.tools.localstack import epp_ready, free_ports
from testkit.localcluster import LocalCluster, dump
from testkit.podlauncher import PodLauncher
from testkit.waiting import wait_until

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(300)]

ROOT = pathlib.Path(__file__).resolve().parents[2]
NAMESPACE = "routing"
DEPLOYMENT = "vllm-llama3-8b"
POOL = "vllm-llama3-8b"
MODEL = "meta-llama/Llama-3.1-8B-Instruct"
ROUTING_WITHIN_S = 5.0  # a scale reflected in the EPP's pool


def documents(path: pathlib.Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


@dataclass
class Stack:
    cluster: LocalCluster
    launcher: PodLauncher
    gateway: str
    metrics_port: int

    def pool_pods(self) -> set[str]:
        """The pods the EPP routes to now (its /debug/pool.json), by name."""
        url = f"http://127.0.0.1:{self.metrics_port}/debug/pool.json"
        with urllib.request.urlopen(url, timeout=5) as response:
            view = json.loads(response.read())
        return {
            pod["name"] for pod in view["pods"] if pod["ready"] and not pod["deleting"] and pod["endpoints"]
        }

    def ask(self) -> tuple[int, str]:
        """One completion through Envoy: (status, the pod that served it)."""
        body = json.dumps({"model": MODEL, "prompt": "Say hello.", "max_tokens": 4}).encode()
        request = urllib.request.Request(
            f"{self.gateway}/v1/completions", data=body, headers={"content-type": "application/json"}
        )
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                response.read()
                return response.status, response.headers.get("x-inference-pod", "")
        except urllib.error.HTTPError as error:
            return error.code, ""

    def scale(self, replicas: int) -> None:
        self.cluster.kubectl("scale", "deployment", DEPLOYMENT, "-n", NAMESPACE, f"--replicas={replicas}")


@pytest.fixture(scope="module")
def stack(cluster: LocalCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    workdir = tmp_path_factory.mktemp("routing")
    cluster.kubectl("create", "namespace", NAMESPACE)
    samples = ROOT / "manifests" / "samples"
    objects = [*documents(samples / "inferencepool.yaml"), *documents(samples / "inferencemodels.yaml")]
    deployment = documents(ROOT / "manifests" / "sim" / "deployment.yaml")[0]
    deployment["spec"]["replicas"] = 2
    cluster.apply(dump([*objects, deployment]), "-n", NAMESPACE)
    grpc, health, metrics, listen = free_ports(4)
    with PodLauncher(cluster, NAMESPACE, "app=vllm", workdir) as launcher:
        log = (workdir / "epp.log").open("wb")
        epp = subprocess.Popen(
            [
                *(sys.executable, "-m", "epp", "serve", f"--kubeconfig={cluster.kubeconfig}"),
                *(f"--pool-name={POOL}", f"--pool-namespace={NAMESPACE}", f"--grpc-port={grpc}"),
                *(f"--grpc-health-port={health}", f"--metrics-port={metrics}"),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, "POD_NAMESPACE": NAMESPACE},
        )
        log.close()
        envoy_config = workdir / "envoy.yaml"
        options = EnvoyOptions(
            listen_address="127.0.0.1",
            listen_port=listen,
            upstream=Upstream.ORIGINAL_DST,  # the pods are not known when Envoy starts
            epp=HostPort("127.0.0.1", grpc),
            epp_health_port=health,
        )
        envoy_config.write_text(render_yaml(build_bootstrap(options)))
        envoy = EnvoyProcess(envoy_config, log_path=workdir / "envoy.log")
        try:
            wait_until(lambda: epp_ready(health), "the EPP ready", within_s=60)
            envoy.start()
            built = Stack(cluster, launcher, f"http://127.0.0.1:{listen}", metrics)
            wait_until(lambda: len(launcher.running()) == 2, "both sim pods running", within_s=60)
            wait_until(lambda: built.pool_pods() == set(launcher.running()), "the EPP's pool", within_s=30)
            yield built
        finally:
            envoy.stop()
            epp.terminate()
            epp.wait(timeout=30)
    cluster.kubectl("delete", "namespace", NAMESPACE, "--wait=false")


def test_every_request_is_served_by_a_pod_of_the_deployment(stack: Stack) -> None:
    answers = [stack.ask() for _ in range(20)]
    assert all(status == 200 for status, _ in answers), answers
    assert {pod for _, pod in answers} <= set(stack.launcher.running())


def test_scaling_up_and_down_changes_where_the_epp_routes_within_seconds(stack: Stack) -> None:
    before = set(stack.launcher.running())
    stack.scale(3)
    wait_until(lambda: len(stack.launcher.running()) == 3, "the third pod running", within_s=30)
    (new,) = set(stack.launcher.running()) - before
    started = time.monotonic()
    wait_until(lambda: new in stack.pool_pods(), "the new pod in the EPP's pool", within_s=ROUTING_WITHIN_S)
    print(f"scale up: the new pod routable {time.monotonic() - started:.2f} s after it ran")

    def served_by_new() -> bool:
        status, pod = stack.ask()
        assert status == 200
        return pod == new

    wait_until(served_by_new, "a request served by the new pod", within_s=30)

    stack.scale(1)
    started = time.monotonic()
    wait_until(lambda: len(stack.pool_pods()) == 1, "two pods out of the pool", within_s=ROUTING_WITHIN_S)
    print(f"scale down: out of the pool in {time.monotonic() - started:.2f} s")
    (kept,) = stack.pool_pods()
    answers = [stack.ask() for _ in range(10)]
    assert answers == [(200, kept)] * 10
