"""The `Stack` on a real cluster, through the kubeconfig (as set up by kind/up.sh).

Reads with the official `kubernetes` client; reaches the gateway with `kubectl port-forward`
(works for any cluster, with no LoadBalancer needed). Where the gateway's Service is comes
from the ConfigMap `lora-epp-e2e` that kind/up.sh writes, or from E2E_GATEWAY_SERVICE
(`namespace/name:port`) or E2E_GATEWAY_URL for clusters set up another way.
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import re
import select
import subprocess
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager
from typing import Any

import pytest
import urllib3
import yaml
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from e2e.stack import Baseline, Split, finished_by_in
from epp.kube.leader import lease_name_for

POOL_NAME = "vllm-llama3-8b"
EPP_DEPLOYMENT = "vllm-llama3-8b-epp"
SIM_SELECTOR = "app=vllm"
EPP_SELECTOR = "app.kubernetes.io/instance=vllm-llama3-8b-epp"
EPP_METRICS_PORT = 9090
ADAPTERS = ("legal-lora-v1", "legal-lora-v2", "medical-lora", "sql-lora")
ADAPTER_LOADS_METRIC = "vllm_sim:lora_adapter_loads_total"
SECOND_POOL_DIR = pathlib.Path(__file__).parent / "manifests" / "second-pool"
POOL_GROUP, POOL_VERSION, POOL_PLURAL = "inference.networking.k8s.io", "v1", "inferencepools"
MODEL_GROUP, MODEL_VERSION, MODEL_PLURAL = "inference.networking.x-k8s.io", "v1alpha2", "inferencemodels"


class ClusterUnreachable(Exception):
    """No cluster answers through this kubeconfig (the suite skips)."""


def load_api(kubeconfig: str | None) -> client.ApiClient:
    try:
        api: client.ApiClient = config.new_client_from_config(config_file=kubeconfig)  # type: ignore[no-untyped-call]
    except (config.ConfigException, FileNotFoundError, OSError) as err:
        raise ClusterUnreachable(f"no usable kubeconfig ({err})") from None
    try:
        client.VersionApi(api).get_code(_request_timeout=5)
    except (ApiException, urllib3.exceptions.HTTPError, OSError) as err:
        raise ClusterUnreachable(
            f"cluster at {api.configuration.host} does not answer ({type(err).__name__})"
        ) from None
    return api


class PortForward:
    """`kubectl port-forward svc/NAME :PORT` on a free local port, for as long as it is open."""

    def __init__(self, kubeconfig: str | None, namespace: str, service: str, port: int) -> None:
        command = ["kubectl", "port-forward", "-n", namespace, f"svc/{service}", f":{port}"]
        if kubeconfig:
            command[1:1] = ["--kubeconfig", kubeconfig]
        self._process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        assert self._process.stdout is not None
        # "Forwarding from 127.0.0.1:NNNNN -> 80"; kubectl prints nothing while it cannot connect.
        ready, _, _ = select.select([self._process.stdout], [], [], 30)
        line = self._process.stdout.readline() if ready else "no answer from kubectl in 30 s"
        match = re.search(r"127\.0\.0\.1:(\d+)", line)
        if match is None:
            self.close()
            raise ClusterUnreachable(f"kubectl port-forward to {namespace}/{service} failed: {line.strip()}")
        self.url = f"http://127.0.0.1:{match.group(1)}"

    def close(self) -> None:
        if self._process.poll() is None:
            self._process.terminate()
            try:
                self._process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait(timeout=5)


class ClusterStack:
    def __init__(self, api: client.ApiClient, *, namespace: str, kubeconfig: str | None) -> None:
        self._api = api
        self._kubeconfig = kubeconfig
        self.namespace = namespace
        self._core = client.CoreV1Api(api)
        self._apps = client.AppsV1Api(api)
        self._custom = client.CustomObjectsApi(api)
        self._coordination = client.CoordinationV1Api(api)
        self._forwards: list[PortForward] = []
        settings = self._settings()
        self._http_routes = settings.get("httpRoutes", "true") == "true"
        self._gateway_url = os.environ.get("E2E_GATEWAY_URL", "")
        if not self._gateway_url:
            target = (
                os.environ.get("E2E_GATEWAY_SERVICE")
                or f"{settings.get('service', '')}:{settings.get('port', '80')}"
            )
            where, _, port = target.rpartition(":")
            service_namespace, _, service = where.rpartition("/")
            if not service:
                raise ClusterUnreachable(
                    "no gateway to test: run kind/up.sh, "
                    "or set E2E_GATEWAY_URL or E2E_GATEWAY_SERVICE=ns/name:port"
                )
            forward = PortForward(kubeconfig, service_namespace or namespace, service, int(port))
            self._forwards.append(forward)
            self._gateway_url = forward.url

    def _settings(self) -> dict[str, str]:
        try:
            config_map = self._core.read_namespaced_config_map("lora-epp-e2e", self.namespace)
        except ApiException as err:
            if err.status == 404:
                return {}
            raise
        return dict(config_map.data or {})

    def close(self) -> None:
        for forward in self._forwards:
            forward.close()

    # ----- Stack -----

    @property
    def gateway_url(self) -> str:
        return self._gateway_url

    @property
    def adapters(self) -> Sequence[str]:
        return ADAPTERS

    @property
    def fail_open(self) -> bool:
        pool: Any = self._custom.get_namespaced_custom_object(
            POOL_GROUP, POOL_VERSION, self.namespace, POOL_PLURAL, POOL_NAME
        )
        return bool(pool["spec"]["endpointPickerRef"].get("failureMode") == "FailOpen")

    def _pods(self, selector: str) -> list[Any]:
        return list(self._core.list_namespaced_pod(self.namespace, label_selector=selector).items)

    @staticmethod
    def _ready(pod: Any) -> bool:
        conditions = pod.status.conditions or []
        return pod.metadata.deletion_timestamp is None and any(
            c.type == "Ready" and c.status == "True" for c in conditions
        )

    def endpoints(self) -> dict[str, str]:
        return {
            pod.metadata.name: f"{pod.status.pod_ip}:8000"
            for pod in self._pods(SIM_SELECTOR)
            if self._ready(pod) and pod.status.pod_ip
        }

    def delete_pod(self, name: str) -> None:
        self._core.delete_namespaced_pod(name, self.namespace)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                self._core.read_namespaced_pod(name, self.namespace)
            except ApiException as err:
                if err.status == 404:
                    return
                raise
            time.sleep(1)
        raise AssertionError(f"pod {name} still exists 120 s after deletion")

    def _scale_epp(self, replicas: int) -> None:
        self._apps.patch_namespaced_deployment_scale(
            EPP_DEPLOYMENT, self.namespace, {"spec": {"replicas": replicas}}
        )

    def _wait(self, done: Callable[[], bool], what: str, timeout_s: float = 180) -> None:
        deadline = time.monotonic() + timeout_s
        while not done():
            if time.monotonic() >= deadline:
                raise AssertionError(f"timed out waiting for {what}")
            time.sleep(1)

    @contextlib.contextmanager
    def _epp_stopped(self) -> Iterator[None]:
        replicas = self._epp_replicas()
        self._scale_epp(0)
        try:
            self._wait(lambda: not self._pods(EPP_SELECTOR), "every EPP pod to be gone")
            yield
        finally:
            self._scale_epp(replicas)
            self._wait(
                lambda: any(self._ready(p) for p in self._pods(EPP_SELECTOR)), "an EPP pod to be Ready"
            )

    def epp_stopped(self) -> AbstractContextManager[None]:
        return self._epp_stopped()

    def apply_inference_model(self, name: str, model_name: str, targets: Sequence[str]) -> None:
        body = {
            "apiVersion": f"{MODEL_GROUP}/{MODEL_VERSION}",
            "kind": "InferenceModel",
            "metadata": {"name": name},
            "spec": {
                "modelName": model_name,
                "poolRef": {"group": POOL_GROUP, "name": POOL_NAME},
                "targetModels": [{"name": t} for t in targets],
            },
        }
        try:
            self._custom.create_namespaced_custom_object(
                MODEL_GROUP, MODEL_VERSION, self.namespace, MODEL_PLURAL, body
            )
        except ApiException as err:
            if err.status != 409:
                raise
            self._custom.patch_namespaced_custom_object(
                MODEL_GROUP, MODEL_VERSION, self.namespace, MODEL_PLURAL, name, {"spec": body["spec"]}
            )

    def delete_inference_model(self, name: str) -> None:
        try:
            self._custom.delete_namespaced_custom_object(
                MODEL_GROUP, MODEL_VERSION, self.namespace, MODEL_PLURAL, name
            )
        except ApiException as err:
            if err.status != 404:
                raise

    def _pod_metrics(self, name: str, port: int = 8000) -> str:
        """GET /metrics of a pod through the API server's pod proxy. An API server that refuses
        to proxy to the pod's address (it never proxies to loopback or link-local addresses, and
        the local control plane's pods have loopback IPs) skips the calling check."""
        try:
            text: str = self._core.connect_get_namespaced_pod_proxy_with_path(
                f"{name}:{port}", self.namespace, "metrics"
            )
        except ApiException as err:
            if err.status == 400 and "address not allowed" in str(err.body):
                pytest.skip(
                    "the API server does not proxy to this cluster's pod IPs (address not allowed: "
                    "loopback, as on the local control plane), so pod metrics cannot be read"
                )
            raise
        return text

    def _loads(self, selector: str) -> float:
        from prometheus_client.parser import text_string_to_metric_families

        total = 0.0
        for pod in self._pods(selector):
            if not self._ready(pod):
                continue
            for family in text_string_to_metric_families(self._pod_metrics(pod.metadata.name)):
                total += sum(s.value for s in family.samples if s.name == ADAPTER_LOADS_METRIC)
        return total

    def adapter_loads(self) -> float:
        return self._loads(SIM_SELECTOR)

    @property
    def gateway_access_log(self) -> bool:
        # kind/up.sh records the gateway; agentgateway has no gRPC access log (OTLP logs only).
        return self._settings().get("gateway", "") != "agentgateway"

    def epp_finished_by(self, source: str) -> float:
        total = 0.0
        for pod in self._pods(EPP_SELECTOR):
            with contextlib.suppress(ApiException):
                total += finished_by_in(self._pod_metrics(pod.metadata.name, EPP_METRICS_PORT), source)
        return total

    def epp_log_lines(self) -> list[str]:
        lines: list[str] = []
        for pod in self._pods(EPP_SELECTOR):
            with contextlib.suppress(ApiException):
                lines += self._core.read_namespaced_pod_log(pod.metadata.name, self.namespace).splitlines()
        return lines

    @property
    def baseline(self) -> Baseline | None:
        if not self._http_routes:
            return None  # the plain Envoy gateway has no route to the Service
        return Baseline(
            url=self._gateway_url,
            headers={"x-route-to": "service"},
            adapter_loads=lambda: self._loads(SIM_SELECTOR),
        )

    def _epp_replicas(self) -> int:
        deployment: Any = self._apps.read_namespaced_deployment(EPP_DEPLOYMENT, self.namespace)
        return int(deployment.spec.replicas or 0)

    def _kill_epp_leader(self) -> str:
        lease_name = lease_name_for(self.namespace, POOL_NAME)
        lease: Any = self._coordination.read_namespaced_lease(lease_name, self.namespace)
        holder = lease.spec.holder_identity
        assert holder, f"lease {lease_name} has no holder"
        # The holder is the pod's host name (its name) and a random suffix: `NAME_SUFFIX`.
        pods = [str(p.metadata.name) for p in self._pods(EPP_SELECTOR)]
        leader = next((name for name in pods if holder == name or holder.startswith(f"{name}_")), None)
        assert leader, f"lease {lease_name} is held by {holder!r}, which names no EPP pod of {sorted(pods)}"
        self._core.delete_namespaced_pod(leader, self.namespace, grace_period_seconds=0)
        return leader

    @property
    def kill_epp_leader(self) -> Callable[[], str] | None:
        return self._kill_epp_leader if self._epp_replicas() >= 2 else None

    @contextlib.contextmanager
    def _split(self) -> Iterator[Split]:
        objects = _kustomize(SECOND_POOL_DIR)
        for obj in objects:
            self._apply(obj)
        try:
            self._wait(
                lambda: (
                    any(self._ready(p) for p in self._pods("app.kubernetes.io/instance=vllm-llama3-8b-epp-b"))
                    and sum(self._ready(p) for p in self._pods("app=vllm-b")) >= 2
                ),
                "the second pool's EPP and pods",
            )
            route = next(o for o in objects if o["kind"] == "HTTPRoute")
            weights = {
                ref["name"]: int(ref.get("weight", 1)) for ref in route["spec"]["rules"][0]["backendRefs"]
            }
            pods_b = {p.metadata.name for p in self._pods("app=vllm-b")}
            yield Split(
                headers={"x-route-to": "split"},
                weights=weights,
                pool_of_pod=lambda pod: "vllm-llama3-8b-b" if pod in pods_b else POOL_NAME,
            )
        finally:
            for obj in reversed(objects):
                self._delete(obj)

    @property
    def split(self) -> Callable[[], AbstractContextManager[Split]] | None:
        return self._split if self._http_routes else None

    def _apply(self, obj: dict[str, Any]) -> None:
        subprocess.run(
            self._kubectl("apply", "-n", self.namespace, "-f", "-"),
            input=yaml.safe_dump(obj),
            text=True,
            check=True,
        )

    def _delete(self, obj: dict[str, Any]) -> None:
        subprocess.run(
            self._kubectl("delete", "--ignore-not-found", "-n", self.namespace, "-f", "-"),
            input=yaml.safe_dump(obj),
            text=True,
            check=True,
        )

    def _kubectl(self, *args: str) -> list[str]:
        return ["kubectl", *(["--kubeconfig", self._kubeconfig] if self._kubeconfig else []), *args]


def _kustomize(directory: pathlib.Path) -> list[dict[str, Any]]:
    rendered = subprocess.run(
        ["kubectl", "kustomize", str(directory)], capture_output=True, text=True, check=True
    )
    return [doc for doc in yaml.safe_load_all(rendered.stdout) if doc]
