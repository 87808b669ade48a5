"""Envoy → `epp serve` (Kubernetes source) → simulated model servers that are real Pods.

The Pods come from `manifests/sim/deployment.yaml`, scheduled by kube-scheduler onto the kwok
node, Ready by kwok, each with a 127.1.x IP on which `PodLauncher` runs the Pod's own container
arguments (`epp sim ...`). The pool and models are `manifests/samples/`. What a user sees:

- every request is answered 200 by one of the Deployment's Pods;
- `kubectl scale` up: the new Pod is in the EPP's pool within seconds and gets requests;
  down: the Pods gone leave the pool within seconds and every request still succeeds;
- a Pod deleted under load loses no request; a Pod whose Ready condition turns False leaves the
  pool within seconds and comes back when it is Ready again.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import threading
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
from tests.cluster.gateway import MODEL, ask

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(300)]

ROOT = pathlib.Path(__file__).resolve().parents[2]
NAMESPACE = "routing"
DEPLOYMENT = "vllm-llama3-8b"
POOL = "vllm-llama3-8b"
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
        """One completion through Envoy: (status, the pod that served it, or why it failed)."""
        return ask(self.gateway)

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
    with PodLauncher(cluster, NAMESPACE, "app=vllm", workdir, kubelet=True) as launcher:
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


def _scaled_to(stack: Stack, replicas: int) -> set[str]:
    """Scale the Deployment and wait until exactly its running pods are in the EPP's pool."""
    stack.scale(replicas)
    wait_until(lambda: len(stack.launcher.running()) == replicas, f"{replicas} pods running", within_s=30)
    wait_until(
        lambda: stack.pool_pods() == set(stack.launcher.running()),
        "the EPP's pool",
        within_s=ROUTING_WITHIN_S,
    )
    return stack.pool_pods()


@dataclass(frozen=True)
class _Answer:
    started: float
    status: int
    pod: str


def test_a_pod_deleted_under_load_loses_no_request(stack: Stack) -> None:
    """`kubectl delete pod` while 8 clients send: the EPP drops the pod from its pool as soon as
    the API server marks it terminating, the pod finishes what it holds (its grace period), and
    Envoy retries a connection refused by it on the next endpoint — so every request is answered
    200, and none that starts after the pod left the pool goes to it."""
    pods = _scaled_to(stack, 3)
    victim = sorted(pods)[0]
    clients, per_client = 8, 25
    answers: list[_Answer] = []
    lock = threading.Lock()
    sent = threading.Semaphore(0)

    def client() -> None:
        for _ in range(per_client):
            started = time.monotonic()
            status, pod = stack.ask()
            with lock:
                answers.append(_Answer(started, status, pod))
            sent.release()

    threads = [threading.Thread(target=client, daemon=True) for _ in range(clients)]
    for thread in threads:
        thread.start()
    for _ in range(clients * 3):  # a few rounds of traffic before the deletion, victim included
        assert sent.acquire(timeout=30), "no traffic"
    stack.cluster.kubectl("delete", "pod", victim, "-n", NAMESPACE, "--wait=false")
    wait_until(
        lambda: victim not in stack.pool_pods(), "the deleted pod out of the pool", within_s=ROUTING_WITHIN_S
    )
    left_pool = time.monotonic()
    for thread in threads:
        thread.join(timeout=120)
    assert not any(thread.is_alive() for thread in threads), "clients still running after 120 s"

    assert len(answers) == clients * per_client
    failed = [a for a in answers if a.status != 200]
    assert not failed, f"{len(failed)} of {len(answers)} requests failed: {failed[:5]}"
    assert any(a.pod == victim for a in answers), "the deleted pod served nothing before it went"
    late = [a for a in answers if a.started > left_pool and a.pod == victim]
    assert not late, f"{len(late)} requests sent to {victim} after it left the pool"


def test_a_pod_turning_not_ready_leaves_the_pool_and_comes_back(stack: Stack) -> None:
    """A failing readiness probe, as the kubelet reports it (the pod's Ready condition False on
    its status): the EPP stops routing to the pod within seconds, and routes to it again once it
    is Ready."""
    pods = _scaled_to(stack, 2)
    sick = sorted(pods)[0]

    def ready(value: str) -> None:
        patch = {"status": {"conditions": [{"type": "Ready", "status": value}]}}
        stack.cluster.kubectl(
            "patch", "pod", sick, "-n", NAMESPACE, "--subresource=status", "-p", json.dumps(patch)
        )

    ready("False")
    started = time.monotonic()
    wait_until(
        lambda: sick not in stack.pool_pods(), "the not-ready pod out of the pool", within_s=ROUTING_WITHIN_S
    )
    print(f"not ready: out of the pool in {time.monotonic() - started:.2f} s")
    answers = [stack.ask() for _ in range(10)]
    assert all(status == 200 for status, _ in answers), answers
    assert sick not in {pod for _, pod in answers}

    ready("True")
    wait_until(lambda: sick in stack.pool_pods(), "the pod back in the pool", within_s=ROUTING_WITHIN_S)

    def served_by_sick() -> bool:
        status, pod = stack.ask()
        assert status == 200
        return pod == sick

    wait_until(served_by_sick, "a request served by the pod again", within_s=30)


# -- InferenceModel and InferenceObjective, managed with kubectl ------------------------------


def _complete(stack: Stack, model: str, headers: dict[str, str] | None = None) -> tuple[int, str]:
    """One completion through Envoy: (status, the model that served it)."""
    body = json.dumps({"model": model, "prompt": "Say hello.", "max_tokens": 2}).encode()
    request = urllib.request.Request(
        f"{stack.gateway}/v1/completions",
        data=body,
        headers={"content-type": "application/json", **(headers or {})},
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, str(json.loads(response.read())["model"])
    except urllib.error.HTTPError as error:
        return error.code, ""


def _last_decision(stack: Stack, model: str) -> dict[str, Any]:
    """The EPP's newest decision for requests that asked for `model` (its /debug/decisions)."""
    url = f"http://127.0.0.1:{stack.metrics_port}/debug/decisions?limit=50"
    with urllib.request.urlopen(url, timeout=5) as response:
        decisions = json.loads(response.read())["decisions"]
    found: dict[str, Any] = next(d for d in decisions if d["model"] == model)
    return found


def _edit(stack: Stack, resource: str, *substitutions: tuple[str, str]) -> None:
    """`kubectl edit`, with sed as the editor: what a user does by hand, scripted."""
    script = " ".join(f"-e 's/{old}/{new}/'" for old, new in substitutions)
    result = subprocess.run(
        [
            *(stack.cluster.kubectl_bin, "--kubeconfig", str(stack.cluster.kubeconfig)),
            *("edit", resource, "-n", NAMESPACE),
        ],
        env={**os.environ, "KUBE_EDITOR": f"sed -i {script}"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0 and "edited" in result.stdout, result.stdout + result.stderr


def _served(stack: Stack, model: str, headers: dict[str, str] | None = None, **want: object) -> bool:
    """A request for `model` answered 200, and the EPP's decision for it shows `want`
    (`target_model`, `criticality`, `priority`)."""
    status, served = _complete(stack, model, headers)
    if status != 200:
        return False
    decision = _last_decision(stack, model)
    if "target_model" in want and served != want["target_model"]:
        return False
    return all(decision[key] == value for key, value in want.items())


def test_an_inference_model_applied_edited_and_deleted_with_kubectl_changes_routing(stack: Stack) -> None:
    """`kubectl apply` of a new InferenceModel makes its name routable to its target adapter with
    its criticality; `kubectl edit` of target and criticality takes effect within seconds;
    the EPP's Accepted condition shows in `kubectl get -o yaml`; `kubectl delete` makes the
    name unknown (404) again."""
    model = {
        "apiVersion": "inference.networking.x-k8s.io/v1alpha2",
        "kind": "InferenceModel",
        "metadata": {"name": "support-bot"},
        "spec": {
            "modelName": "support-bot",
            "criticality": "Sheddable",
            "poolRef": {"name": POOL},
            "targetModels": [{"name": "legal-lora-v1"}],
        },
    }
    assert _complete(stack, "support-bot")[0] == 404
    stack.cluster.apply(dump([model]), "-n", NAMESPACE)
    wait_until(
        lambda: _served(stack, "support-bot", target_model="legal-lora-v1", criticality="Sheddable"),
        "support-bot served by legal-lora-v1 as Sheddable",
        within_s=ROUTING_WITHIN_S,
    )

    def accepted() -> bool:
        shown = yaml.safe_load(
            stack.cluster.kubectl(
                "get", "inferencemodel", "support-bot", "-n", NAMESPACE, "-o", "yaml"
            ).stdout
        )
        conditions = (shown.get("status") or {}).get("conditions") or []
        return any(c["type"] == "Accepted" and c["status"] == "True" for c in conditions)

    wait_until(accepted, "the EPP's Accepted condition on support-bot", within_s=ROUTING_WITHIN_S)

    _edit(stack, "inferencemodel/support-bot", ("Sheddable", "Critical"), ("legal-lora-v1", "medical-lora"))
    wait_until(
        lambda: _served(stack, "support-bot", target_model="medical-lora", criticality="Critical"),
        "support-bot served by medical-lora as Critical after kubectl edit",
        within_s=ROUTING_WITHIN_S,
    )

    stack.cluster.kubectl("delete", "inferencemodel", "support-bot", "-n", NAMESPACE)
    wait_until(
        lambda: _complete(stack, "support-bot")[0] == 404,
        "support-bot unknown again",
        within_s=ROUTING_WITHIN_S,
    )


def test_an_inference_objective_applied_edited_and_deleted_with_kubectl_sets_the_priority_band(
    stack: Stack,
) -> None:
    """The sample InferenceObjective (`batch-jobs`, priority -1) applied with kubectl: a request
    naming it in `x-gateway-inference-objective` is decided in band -1; edited to 2, in band 2;
    deleted, in the default band 0."""
    objective = {"x-gateway-inference-objective": "batch-jobs"}
    stack.cluster.kubectl(
        "apply", "-n", NAMESPACE, "-f", str(ROOT / "manifests" / "samples" / "inferenceobjective.yaml")
    )
    wait_until(lambda: _served(stack, MODEL, objective, priority=-1), "band -1", within_s=ROUTING_WITHIN_S)
    _edit(stack, "inferenceobjective/batch-jobs", ("priority: -1", "priority: 2"))
    wait_until(
        lambda: _served(stack, MODEL, objective, priority=2),
        "band 2 after kubectl edit",
        within_s=ROUTING_WITHIN_S,
    )
    stack.cluster.kubectl("delete", "inferenceobjective", "batch-jobs", "-n", NAMESPACE)
    wait_until(
        lambda: _served(stack, MODEL, objective, priority=0), "band 0 once deleted", within_s=ROUTING_WITHIN_S
    )


def test_an_inference_model_the_epp_rejects_gets_a_warning_event_in_kubectl_describe(stack: Stack) -> None:
    """A typo the CRD's schema lets through (`poolRef.kind: InferencePol`) is refused by the EPP,
    which says why in a Warning Event on the object: `kubectl describe` shows it."""
    typo = {
        "apiVersion": "inference.networking.x-k8s.io/v1alpha2",
        "kind": "InferenceModel",
        "metadata": {"name": "typo-bot"},
        "spec": {"modelName": "typo-bot", "poolRef": {"name": POOL, "kind": "InferencePol"}},
    }
    stack.cluster.apply(dump([typo]), "-n", NAMESPACE)
    try:

        def described() -> str:
            return stack.cluster.kubectl("describe", "inferencemodel", "typo-bot", "-n", NAMESPACE).stdout

        wait_until(lambda: "Warning" in described(), "a Warning Event on typo-bot", within_s=ROUTING_WITHIN_S)
        assert "must be InferencePool" in described(), described()
        assert _complete(stack, "typo-bot")[0] == 404
    finally:
        stack.cluster.kubectl("delete", "inferencemodel", "typo-bot", "-n", NAMESPACE)
