"""The real controller against an API server (the fake one, or a cluster with `--kube-real`):
applying the brief's object yields the whole serving stack; scale-out, adapter edits, bad
specs and readiness behave as a user expects; a second pass writes nothing."""

from __future__ import annotations

import asyncio
import copy
import json
import os
import pathlib
import random
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from epp.kube.api import AsyncKubeApi, load_api_client
from epp.operator.controller.adapter_survey import AdapterSurvey
from epp.operator.controller.reconcile import Outcome, Reconciler
from epp.tools.localstack import pick_pod_addresses
from testkit.waiting import wait_until
from tests.fakekube.plugin import KubeEnv, needs_fake

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

ROOT = pathlib.Path(__file__).resolve().parents[2]
LLMIS = "inference.llm-d.ai/v1alpha1"
MODEL_API = "inference.networking.x-k8s.io/v1alpha2"
POOL_API = "inference.networking.k8s.io/v1"


def brief_object(env: KubeEnv) -> dict[str, Any]:
    """The brief's fragments assembled (the sample), in the test namespace."""
    (obj,) = yaml.safe_load_all(
        (ROOT / "manifests" / "controller" / "samples" / "legal-assistants.yaml").read_text()
    )
    obj["metadata"]["namespace"] = env.namespace
    return dict(obj)


def reconcile(env: KubeEnv, name: str = "legal-assistants", survey: AdapterSurvey | None = None) -> Outcome:
    reconciler = Reconciler(AsyncKubeApi(load_api_client(env.kubeconfig)), survey=survey)
    current = env.get(LLMIS, "LLMInferenceService", env.namespace, name)
    assert current is not None
    return asyncio.run(reconciler.reconcile(current))


# What Kubernetes' own controllers put in every namespace.
NAMESPACE_BUILT_INS = frozenset({"ConfigMap/kube-root-ca.crt", "ServiceAccount/default"})


def as_written(objects: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The objects without what Kubernetes' own controllers change on them (status, and the
    resourceVersion and field ownership that move with it): what the controller writes."""
    server_owned = ("resourceVersion", "managedFields")
    return {
        key: {k: v for k, v in obj.items() if k != "status"}
        | {"metadata": {k: v for k, v in obj["metadata"].items() if k not in server_owned}}
        for key, obj in objects.items()
    }


def owned(env: KubeEnv) -> dict[str, dict[str, Any]]:
    kinds = [
        ("apps/v1", "Deployment"),
        ("v1", "Service"),
        ("v1", "ConfigMap"),
        ("v1", "ServiceAccount"),
        ("rbac.authorization.k8s.io/v1", "Role"),
        ("rbac.authorization.k8s.io/v1", "RoleBinding"),
        (POOL_API, "InferencePool"),
        (MODEL_API, "InferenceModel"),
    ]
    found = {
        f"{kind}/{obj['metadata']['name']}": obj
        for api_version, kind in kinds
        for obj in env.list(api_version, kind, env.namespace)
    }
    return {key: obj for key, obj in found.items() if key not in NAMESPACE_BUILT_INS}


def vllm_args(env: KubeEnv) -> list[str]:
    deployment = env.get("apps/v1", "Deployment", env.namespace, "legal-assistants")
    assert deployment is not None
    args: list[str] = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    return args


def test_the_brief_object_yields_the_full_stack_owned_by_it(kube: KubeEnv) -> None:
    created = kube.put(brief_object(kube))
    outcome = reconcile(kube)
    objects = owned(kube)
    assert sorted(objects) == [
        "ConfigMap/legal-assistants-epp",
        "Deployment/legal-assistants",
        "Deployment/legal-assistants-epp",
        "InferenceModel/legal-assistants-code-reviewer-xl",
        "InferenceModel/legal-assistants-legal-assistant-v2",
        "InferenceModel/legal-assistants-llama-3.1-70b",
        "InferencePool/legal-assistants",
        "Role/legal-assistants-epp",
        "RoleBinding/legal-assistants-epp",
        "Service/legal-assistants",
        "Service/legal-assistants-epp",
        "ServiceAccount/legal-assistants-epp",
    ]
    for obj in objects.values():
        (ref,) = obj["metadata"]["ownerReferences"]
        assert (ref["kind"], ref["name"], ref["uid"], ref["controller"]) == (
            "LLMInferenceService",
            "legal-assistants",
            created["metadata"]["uid"],
            True,
        )
    deployment = objects["Deployment/legal-assistants"]
    assert deployment["spec"]["replicas"] == 6
    assert deployment["spec"]["strategy"]["rollingUpdate"] == {"maxUnavailable": 0, "maxSurge": 1}
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert {"--enable-lora", "--max-loras=4", "--served-model-name=llama-3.1-70b"} <= set(container["args"])
    assert "--model=meta-llama/Llama-3.1-70B-Instruct" in container["args"]
    assert not any(a.startswith("--lora-modules") for a in container["args"])  # demand: loaded at run time
    assert {"name": "VLLM_ALLOW_RUNTIME_LORA_UPDATING", "value": "True"} in container["env"]
    sidecar = deployment["spec"]["template"]["spec"]["containers"][1]
    assert sidecar["args"] == ["sidecar", "--model-server=http://127.0.0.1:8000", "--port=9010"]
    models = {o["spec"]["modelName"] for k, o in objects.items() if k.startswith("InferenceModel/")}
    assert models == {"llama-3.1-70b", "legal-assistant-v2", "code-reviewer-xl"}
    data = objects["ConfigMap/legal-assistants-epp"]["data"]
    catalog = yaml.safe_load(data["adapters.yaml"])
    assert catalog == {
        "preloadStrategy": "demand",
        "adapters": [
            {"name": "legal-assistant-v2", "path": "legal-lora"},
            {"name": "code-reviewer-xl", "path": "code-lora"},
        ],
    }
    scheduler = yaml.safe_load(data["scheduler.yaml"])
    assert scheduler["kind"] == "EndpointPickerConfig"
    weights = {e["pluginRef"]: e.get("weight") for e in scheduler["schedulingProfiles"][0]["plugins"]}
    assert weights["adapter-affinity-scorer"] == 0.5 and weights["kv-cache-match-scorer"] == 0.2
    pool = objects["InferencePool/legal-assistants"]["spec"]
    assert pool["endpointPickerRef"]["name"] == "legal-assistants-epp"
    assert pool["selector"]["matchLabels"] == deployment["spec"]["selector"]["matchLabels"]
    status = kube.get(LLMIS, "LLMInferenceService", kube.namespace, "legal-assistants")["status"]  # type: ignore[index]
    assert (status["replicas"], status["readyReplicas"]) == (6, 0)
    assert status["adapters"] == {
        "desired": 2,
        "loaded": 0,
        "loadedNames": [],
        "readyPods": 0,
        "reportingPods": 0,
        "summary": "0/2",
    }
    (ready,) = status["conditions"]
    assert (ready["type"], ready["status"], ready["reason"]) == ("Ready", "False", "Progressing")
    assert not outcome.ready


def test_a_second_pass_writes_nothing(kube: KubeEnv) -> None:
    kube.put(brief_object(kube))
    first = reconcile(kube)
    assert len(first.writes) >= 12
    second = reconcile(kube)
    assert second.writes == ()


def test_scale_out_patches_only_the_replica_count(kube: KubeEnv) -> None:
    kube.put(brief_object(kube))
    reconcile(kube)
    before = kube.get("apps/v1", "Deployment", kube.namespace, "legal-assistants")
    obj = kube.get(LLMIS, "LLMInferenceService", kube.namespace, "legal-assistants")
    assert obj is not None and before is not None
    obj["spec"]["replicas"] = 8
    kube.put(obj)
    outcome = reconcile(kube)
    assert [w for w in outcome.writes if not w.endswith("/status")] == ["patch Deployment/legal-assistants"]
    after = kube.get("apps/v1", "Deployment", kube.namespace, "legal-assistants")
    assert after is not None
    assert after["spec"]["replicas"] == 8
    assert after["spec"]["template"] == before["spec"]["template"]  # no pod restarts


def test_adapter_edits_on_demand_change_no_pod_template(kube: KubeEnv) -> None:
    kube.put(brief_object(kube))
    reconcile(kube)
    template = kube.get("apps/v1", "Deployment", kube.namespace, "legal-assistants")["spec"]["template"]  # type: ignore[index]
    obj = kube.get(LLMIS, "LLMInferenceService", kube.namespace, "legal-assistants")
    assert obj is not None
    obj["spec"]["adapters"]["items"] = [
        {"name": "legal-assistant-v2", "source": "huggingface/legal-lora"},
        {"name": "tax-advisor", "source": "hf://org/tax-lora"},
    ]
    kube.put(obj)
    outcome = reconcile(kube)
    assert sorted(w for w in outcome.writes if not w.endswith("/status")) == [
        "create InferenceModel/legal-assistants-tax-advisor",
        "delete InferenceModel/legal-assistants-code-reviewer-xl",
        "patch ConfigMap/legal-assistants-epp",
    ]
    after = kube.get("apps/v1", "Deployment", kube.namespace, "legal-assistants")
    assert after is not None and after["spec"]["template"] == template
    data = kube.get("v1", "ConfigMap", kube.namespace, "legal-assistants-epp")["data"]  # type: ignore[index]
    assert "tax-advisor" in data["adapters.yaml"] and "code-reviewer-xl" not in data["adapters.yaml"]


def test_preload_all_registers_adapters_at_start(kube: KubeEnv) -> None:
    obj = brief_object(kube)
    obj["spec"]["adapters"]["preloadStrategy"] = "all"
    kube.put(obj)
    reconcile(kube)
    args = vllm_args(kube)
    start = args.index("--lora-modules")
    assert args[start + 1 :] == ["legal-assistant-v2=legal-lora", "code-reviewer-xl=code-lora"]


def test_s3_sources_get_an_init_container_and_secret_refs_not_values(kube: KubeEnv) -> None:
    obj = brief_object(kube)
    obj["spec"]["adapters"]["items"] = [
        {"name": "legal-assistant-v2", "source": "s3://loras/legal", "secretRef": "aws-creds"},
        {"name": "code-reviewer-xl", "source": "huggingface/org/code-lora", "secretRef": "hf-token"},
    ]
    kube.put(obj)
    reconcile(kube)
    deployment = kube.get("apps/v1", "Deployment", kube.namespace, "legal-assistants")
    assert deployment is not None
    pod = deployment["spec"]["template"]["spec"]
    (init,) = pod["initContainers"]
    assert init["args"] == ["s3", "cp", "--recursive", "s3://loras/legal", "/adapters/legal-assistant-v2"]
    assert {e["name"]: e["valueFrom"]["secretKeyRef"]["name"] for e in init["env"]} == {
        "AWS_ACCESS_KEY_ID": "aws-creds",
        "AWS_SECRET_ACCESS_KEY": "aws-creds",
    }
    env = {e["name"]: e for e in pod["containers"][0]["env"]}
    assert env["HF_TOKEN"]["valueFrom"] == {"secretKeyRef": {"name": "hf-token", "key": "HF_TOKEN"}}


def test_each_brief_fragment_applied_alone_is_reconciled(kube: KubeEnv) -> None:
    for index, path in enumerate(sorted((ROOT / "tests" / "fixtures" / "llmis").glob("*.yaml"))):
        (obj,) = yaml.safe_load_all(path.read_text())
        obj["metadata"] = {"name": f"fragment-{index}", "namespace": kube.namespace}
        kube.put(obj)
        outcome = reconcile(kube, f"fragment-{index}")
        assert outcome.reason == "Progressing", (path.name, outcome.message)


def test_a_bad_spec_is_reported_and_changes_nothing(kube: KubeEnv) -> None:
    kube.put(brief_object(kube))
    reconcile(kube)
    before = as_written(owned(kube))
    obj = kube.get(LLMIS, "LLMInferenceService", kube.namespace, "legal-assistants")
    assert obj is not None
    obj["spec"]["adapters"]["items"].append({"name": "No_Such", "source": "ftp://x"})
    kube.put(obj)
    outcome = reconcile(kube)
    assert outcome.reason == "InvalidSpec" and "spec.adapters[2].name" in outcome.message
    assert as_written(owned(kube)) == before
    status = kube.get(LLMIS, "LLMInferenceService", kube.namespace, "legal-assistants")["status"]  # type: ignore[index]
    (ready,) = status["conditions"]
    assert (ready["status"], ready["reason"]) == ("False", "InvalidSpec")
    events = [e for e in kube.list("v1", "Event", kube.namespace) if e["reason"] == "InvalidSpec"]
    assert len(events) == 1 and events[0]["involvedObject"]["name"] == "legal-assistants"
    assert events[0]["type"] == "Warning"
    reconcile(kube)  # the same error again: no second Event
    assert len([e for e in kube.list("v1", "Event", kube.namespace) if e["reason"] == "InvalidSpec"]) == 1


@pytest.mark.fake_kube(reason="sets Deployment status as no controller would here")
def test_ready_once_model_servers_and_epp_are_ready(kube: KubeEnv) -> None:
    fake = needs_fake(kube)
    kube.put(brief_object(kube))
    reconcile(kube)
    for name, ready in (("legal-assistants", 6), ("legal-assistants-epp", 1)):
        deployment = kube.get("apps/v1", "Deployment", kube.namespace, name)
        assert deployment is not None
        deployment["status"] = {"replicas": ready, "readyReplicas": ready}
        fake.put(deployment)
    outcome = reconcile(kube)
    assert outcome.ready and outcome.reason == "Available"
    status = kube.get(LLMIS, "LLMInferenceService", kube.namespace, "legal-assistants")["status"]  # type: ignore[index]
    assert status["readyReplicas"] == 6
    assert status["conditions"][0]["status"] == "True"


@pytest.mark.fake_kube(reason="records every call the client made")
def test_every_call_is_granted_by_the_controller_role(kube: KubeEnv) -> None:
    fake = needs_fake(kube)
    kube.put(brief_object(kube))
    reconcile(kube)
    obj = kube.get(LLMIS, "LLMInferenceService", kube.namespace, "legal-assistants")
    assert obj is not None
    obj["spec"]["adapters"]["items"] = [{"name": "x", "source": "/x"}]
    kube.put(obj)
    reconcile(kube)
    obj = copy.deepcopy(obj)
    obj["spec"]["replicas"] = "bad"
    kube.put(obj)
    reconcile(kube)
    asyncio.run(
        Reconciler(AsyncKubeApi(load_api_client(kube.kubeconfig))).reconcile_namespace(kube.namespace)
    )
    used = {(c.group, c.resource, c.verb) for c in fake.calls}
    assert {"create", "patch", "delete", "list", "get"} <= {verb for _, _, verb in used}
    assert used <= granted_by_role(), sorted(used - granted_by_role())


def granted_by_role() -> set[tuple[str, str, str]]:
    (role,) = yaml.safe_load_all((ROOT / "manifests" / "controller" / "role.yaml").read_text())
    return {
        (group, resource, verb)
        for rule in role["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }


def test_epp_controller_command_reconciles_the_namespace(kube: KubeEnv) -> None:
    kube.put(brief_object(kube))
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "epp",
            "controller",
            "--kubeconfig",
            kube.kubeconfig,
            "--namespace",
            kube.namespace,
            "--once",
        ],
        capture_output=True,
        timeout=30,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        check=False,
    )
    assert result.returncode == 0, result.stderr.decode()[-2000:]
    assert "InferencePool/legal-assistants" in owned(kube)


def test_the_running_controller_follows_creates_and_edits_and_stops_on_sigterm(kube: KubeEnv) -> None:
    process = subprocess.Popen(
        [
            *(sys.executable, "-m", "epp", "controller", "--kubeconfig", kube.kubeconfig),
            *("--namespace", kube.namespace, "--resync-period", "2s"),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        kube.put(brief_object(kube))
        wait_until(lambda: "InferencePool/legal-assistants" in owned(kube), "objects created")
        obj = kube.get(LLMIS, "LLMInferenceService", kube.namespace, "legal-assistants")
        assert obj is not None
        obj["spec"]["replicas"] = 2
        kube.put(obj)

        def scaled() -> bool:
            deployment = kube.get("apps/v1", "Deployment", kube.namespace, "legal-assistants")
            return deployment is not None and deployment["spec"]["replicas"] == 2

        wait_until(scaled, "scale-out applied")
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=15) == 0
        if kube.fake is not None:  # every call the running controller made is granted
            used = {(c.group, c.resource, c.verb) for c in kube.fake.calls}
            assert ("inference.llm-d.ai", "llminferenceservices", "watch") in used
            assert used <= granted_by_role(), sorted(used - granted_by_role())
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=5)
        assert process.stderr is not None
        process.stderr.close()


def _replicas(kube: KubeEnv) -> int | None:
    deployment = kube.get("apps/v1", "Deployment", kube.namespace, "legal-assistants")
    return None if deployment is None else int(deployment["spec"]["replicas"])


@pytest.mark.fake_kube(reason="counts the watches open")
def test_sigterm_mid_watch_ends_the_controller_at_once_with_exit_0(kube: KubeEnv) -> None:
    fake = needs_fake(kube)
    kube.put(brief_object(kube))
    process = subprocess.Popen(
        [
            *(sys.executable, "-m", "epp", "controller", "--kubeconfig", kube.kubeconfig),
            *("--namespace", kube.namespace, "--resync-period", "300s"),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        wait_until(lambda: _replicas(kube) == 6, "first pass reconciled")
        wait_until(lambda: fake.open_watches >= 1, "controller watching")
        # History expires mid-watch: the controller relists and still follows edits.
        fake.expire_watches()
        obj = kube.get(LLMIS, "LLMInferenceService", kube.namespace, "legal-assistants")
        assert obj is not None
        obj["spec"]["replicas"] = 3
        kube.put(obj)
        wait_until(lambda: _replicas(kube) == 3, "edit after 410 Gone applied")
        wait_until(lambda: fake.open_watches >= 1, "controller watching again")
        signalled_at = time.monotonic()
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=10) == 0
        assert time.monotonic() - signalled_at < 5.0  # not the 300 s the watch would last
        assert process.stderr is not None
        assert b"Traceback" not in process.stderr.read()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=5)
        assert process.stderr is not None
        process.stderr.close()


def test_scale_out_and_an_added_adapter_change_no_pod_template(kube: KubeEnv) -> None:
    kube.put(brief_object(kube))
    reconcile(kube)
    templates = {
        name: kube.get("apps/v1", "Deployment", kube.namespace, name)["spec"]["template"]  # type: ignore[index]
        for name in ("legal-assistants", "legal-assistants-epp")
    }
    obj = kube.get(LLMIS, "LLMInferenceService", kube.namespace, "legal-assistants")
    assert obj is not None
    obj["spec"]["replicas"] = 8
    obj["spec"]["adapters"]["items"].append({"name": "tax-advisor", "source": "huggingface/tax-lora"})
    kube.put(obj)
    outcome = reconcile(kube)
    assert sorted(w for w in outcome.writes if not w.endswith("/status")) == [
        "create InferenceModel/legal-assistants-tax-advisor",
        "patch ConfigMap/legal-assistants-epp",
        "patch Deployment/legal-assistants",
    ]
    for name, template in templates.items():
        deployment = kube.get("apps/v1", "Deployment", kube.namespace, name)
        assert deployment is not None and deployment["spec"]["template"] == template, name
    assert kube.get("apps/v1", "Deployment", kube.namespace, "legal-assistants")["spec"]["replicas"] == 8  # type: ignore[index]
    catalog = yaml.safe_load(
        kube.get("v1", "ConfigMap", kube.namespace, "legal-assistants-epp")["data"]["adapters.yaml"]  # type: ignore[index]
    )
    assert [a["name"] for a in catalog["adapters"]] == [
        "legal-assistant-v2",
        "code-reviewer-xl",
        "tax-advisor",
    ]
    status = kube.get(LLMIS, "LLMInferenceService", kube.namespace, "legal-assistants")["status"]  # type: ignore[index]
    assert (status["replicas"], status["adapters"]["desired"], status["adapters"]["summary"]) == (8, 3, "0/3")
    assert status["observedGeneration"] == obj["metadata"]["generation"] + 1


# -- garbage collection through owner references ----------------------------------------------


def test_deleting_the_service_collects_everything_it_made_and_nothing_else(kube: KubeEnv) -> None:
    kube.put(brief_object(kube))
    reconcile(kube)
    made = set(owned(kube))
    assert len(made) == 12
    users: list[dict[str, Any]] = [
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "users-own"}, "data": {"k": "v"}},
        {  # labelled like the controller's, but not owned by the service
            "apiVersion": MODEL_API,
            "kind": "InferenceModel",
            "metadata": {
                "name": "users-model",
                "labels": {"inference.llm-d.ai/service": "legal-assistants"},
            },
            "spec": {"modelName": "users-model", "poolRef": {"name": "legal-assistants"}},
        },
    ]
    for obj in users:
        kube.put(obj | {"metadata": {**obj["metadata"], "namespace": kube.namespace}})
    assert kube.delete(LLMIS, "LLMInferenceService", kube.namespace, "legal-assistants")
    wait_until(lambda: not made & set(owned(kube)), "owned objects collected", within_s=30)
    assert set(owned(kube)) == {"ConfigMap/users-own", "InferenceModel/users-model"}


# -- status.adapters: asked of the model-server pods ---------------------------------------------


def _sim(host: str, port: int, name: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [
            *(sys.executable, "-m", "epp", "sim", "--host", host, "--port", str(port), "--pod-name", name),
            *("--served-model-name", "llama-3.1-70b", "--max-loras", "4", "--lora-load-latency", "0.01"),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1):
            return True
    except OSError:
        return False


@pytest.fixture
def model_server_pods() -> Iterator[list[tuple[str, int]]]:
    """Two `epp sim` pods (runtime LoRA loading on) on their own 127.x.y.N, and a third address
    that accepts connections but never answers (a hung pod)."""
    hosts, port = pick_pod_addresses(3, random.Random())
    sims = [_sim(host, port, f"pod-{i}") for i, host in enumerate(hosts[:2])]
    hung = socket.socket()
    try:
        hung.bind((hosts[2], port))
        hung.listen(8)
        for host in hosts[:2]:
            wait_until(lambda h=host: _answers(f"http://{h}:{port}/health"), f"sim on {host}")  # type: ignore[misc]
        yield [(host, port) for host in hosts]
    finally:
        hung.close()
        for sim in sims:
            sim.terminate()
        for sim in sims:
            try:
                sim.wait(timeout=5)
            except subprocess.TimeoutExpired:
                sim.kill()
                sim.wait(timeout=5)


def _pod(name: str, ip: str, port: int, namespace: str, *, ready: bool = True) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {
                "inference.llm-d.ai/service": "legal-assistants",
                "app.kubernetes.io/component": "model-server",
            },
        },
        "spec": {
            "containers": [
                {"name": "vllm", "image": "vllm", "ports": [{"name": "http", "containerPort": port}]}
            ]
        },
        "status": {
            "phase": "Running",
            "podIP": ip,
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        },
    }


def _load_adapter(host: str, port: int, name: str, path: str) -> None:
    request = urllib.request.Request(
        f"http://{host}:{port}/v1/load_lora_adapter",
        data=json.dumps({"lora_name": name, "lora_path": path}).encode(),
        headers={"content-type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        assert response.status == 200


def _adapter_status(kube: KubeEnv) -> dict[str, Any]:
    obj = kube.get(LLMIS, "LLMInferenceService", kube.namespace, "legal-assistants")
    assert obj is not None
    status: dict[str, Any] = (obj.get("status") or {}).get("adapters") or {}
    return status


@pytest.mark.fake_kube(reason="keeps pods on a node that does not exist")
def test_status_counts_the_catalogue_adapters_the_ready_pods_loaded(
    kube: KubeEnv, model_server_pods: list[tuple[str, int]]
) -> None:
    needs_fake(kube)
    (a, port), (b, _), (hung, _) = model_server_pods
    kube.put(brief_object(kube))
    for name, ip, ready in (("pod-a", a, True), ("pod-b", b, True), ("pod-hung", hung, True)):
        kube.put(_pod(name, ip, port, kube.namespace, ready=ready))
    kube.put(_pod("pod-starting", b, port, kube.namespace, ready=False))
    survey = AdapterSurvey(timeout_s=0.5)
    reconcile(kube, survey=survey)
    assert _adapter_status(kube) == {
        "desired": 2,
        "loaded": 0,
        "loadedNames": [],
        "readyPods": 3,  # the starting pod is not asked
        "reportingPods": 2,  # the hung pod counts as holding nothing
        "summary": "0/2",
    }
    _load_adapter(a, port, "legal-assistant-v2", "legal-lora")  # as the EPP loads on demand
    _load_adapter(b, port, "not-in-the-catalogue", "other-lora")
    reconcile(kube, survey=survey)
    status = _adapter_status(kube)
    assert (status["loadedNames"], status["summary"]) == (["legal-assistant-v2"], "1/2")
    _load_adapter(b, port, "legal-assistant-v2", "legal-lora")  # on a second pod: still one adapter
    reconcile(kube, survey=survey)
    assert _adapter_status(kube)["summary"] == "1/2"


@pytest.mark.fake_kube(reason="records every call the client made")
def test_the_running_controller_refreshes_loaded_adapters_each_resync(
    kube: KubeEnv, model_server_pods: list[tuple[str, int]]
) -> None:
    needs_fake(kube)
    (a, port), (b, _), _ = model_server_pods
    kube.put(brief_object(kube))
    kube.put(_pod("pod-a", a, port, kube.namespace))
    kube.put(_pod("pod-b", b, port, kube.namespace))
    process = subprocess.Popen(
        [
            *(sys.executable, "-m", "epp", "controller", "--kubeconfig", kube.kubeconfig),
            *("--namespace", kube.namespace, "--resync-period", "1s", "--adapter-probe-timeout", "500ms"),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        wait_until(lambda: _adapter_status(kube).get("reportingPods") == 2, "first survey")
        # Loading changes no Kubernetes object: only the periodic resync can notice it.
        _load_adapter(a, port, "legal-assistant-v2", "legal-lora")
        _load_adapter(b, port, "code-reviewer-xl", "code-lora")
        wait_until(lambda: _adapter_status(kube).get("summary") == "2/2", "both adapters seen loaded")
        assert _adapter_status(kube)["loadedNames"] == ["legal-assistant-v2", "code-reviewer-xl"]
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=15) == 0
        used = {(c.group, c.resource, c.verb) for c in needs_fake(kube).calls}
        assert ("", "pods", "list") in used
        assert used <= granted_by_role(), sorted(used - granted_by_role())
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=5)
        assert process.stderr is not None
        process.stderr.close()
