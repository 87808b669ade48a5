"""The end-to-end stack of `kind/up.sh` (GATEWAY=envoy) on the local control plane, no container
runtime needed:

    python -m testkit.local_e2e DIR [--namespace NS]

starts a control plane in DIR (`kind/local-cluster.sh`), deploys the stack, prints the `pytest e2e`
command that tests it, and keeps everything running until Ctrl-C. `deployed()` does the same into
a running cluster, for `tests/cluster/test_e2e_suite.py`.

The objects are `kind/up.sh`'s, applied the same way: our CRDs, `kubectl apply -k kind/` (three
`epp sim` pods), `helm upgrade -i vllm-llama3-8b charts/inferencepool -f kind/values.yaml` with
`provider.name=none` and no Gateway or HTTPRoute (the EPP Deployment with two replicas and leader
election, its ServiceAccount and Role, the FailOpen InferencePool, the models), the plain Envoy
gateway of `manifests/gateway/envoy` (its Deployment, ConfigMap and headless Services), and the
ConfigMap `lora-epp-e2e` the suite reads. The Gateway API CRDs are not installed: nothing on this
path uses them (kind/up.sh fetches them from the internet).

What runs where: every Pod of the namespace that is ours or Envoy's runs as a process on its Pod
IP (`testkit.podlauncher.PodLauncher` in kubelet mode: readiness probes, graceful termination,
logs through the API server, each EPP replica with its own ServiceAccount token). The gateway is
the Envoy Pod itself, with the config kind/up.sh gives it: its EPP cluster is the headless
Service of the EPP replicas and its pool cluster the headless Service of the sims, resolved by
`testkit.clusterdns` as CoreDNS would (Ready Pods only). So Envoy follows the EPP replicas and
pods as they come and go, health-checks each replica (only the leader serves), and fails open
over the pool's pods when none does, as in kind. The suite reaches it at its Pod IP
(`E2E_GATEWAY_URL`): with no kube-proxy there is no port-forward to the Service.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import yaml

from e2e.client import complete
from testkit.clusterdns import ClusterDNS
from testkit.localcluster import TOOLS_DIR, ClusterError, LocalCluster, dump, kubectl_path, missing_binaries
from testkit.podlauncher import PodLauncher
from testkit.waiting import wait_until

ROOT = pathlib.Path(__file__).resolve().parents[1]
RELEASE = "vllm-llama3-8b"  # kind/up.sh's release: the pool vllm-llama3-8b, its EPP vllm-llama3-8b-epp
SIMS = "vllm-llama3-8b"
EPP = "vllm-llama3-8b-epp"
GATEWAY = "inference-gateway-envoy"
GATEWAY_LABEL = "app.kubernetes.io/name=inference-gateway-envoy"
READY_WITHIN_S = 150.0


def helm_path() -> str | None:
    """helm as `.ci/k8s_tools.sh` pins it, else PATH's."""
    pinned = TOOLS_DIR / "helm"
    return str(pinned) if pinned.exists() else shutil.which("helm")


@dataclass(frozen=True)
class LocalE2E:
    """The deployed stack: where its gateway answers and how to run the suite against it."""

    cluster: LocalCluster
    namespace: str
    gateway_url: str
    launcher: PodLauncher

    def env(self) -> dict[str, str]:
        """The environment `pytest e2e` needs (kubectl on PATH for the suite's own calls)."""
        path = os.pathsep.join([str(TOOLS_DIR), os.environ.get("PATH", "")])
        return {"E2E_NAMESPACE": self.namespace, "E2E_GATEWAY_URL": self.gateway_url, "PATH": path}

    def pytest_command(self) -> str:
        settings = " ".join(f"{k}={v}" for k, v in self.env().items() if k != "PATH")
        return f"{settings} .venv/bin/pytest e2e --kubeconfig {self.cluster.kubeconfig}"


def install(cluster: LocalCluster, namespace: str, workdir: pathlib.Path) -> None:
    """Apply what kind/up.sh applies for GATEWAY=envoy (steps 3, 5, 6), into `namespace`."""
    helm = helm_path()
    if helm is None:
        raise ClusterError("helm not found: run bash .ci/k8s_tools.sh")
    cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(ROOT / "manifests" / "crds"))
    cluster.kubectl(
        "wait", "--for=condition=Established", "--timeout=60s", "-f", str(ROOT / "manifests" / "crds")
    )
    if cluster.kubectl("get", "namespace", namespace, check=False).returncode != 0:
        cluster.kubectl("create", "namespace", namespace)
    cluster.kubectl("apply", "-n", namespace, "-k", str(ROOT / "kind"))
    helm_home = workdir / "helm"
    result = subprocess.run(
        [
            *(helm, "upgrade", "-i", RELEASE, str(ROOT / "charts" / "inferencepool")),
            *("-n", namespace, "--skip-crds", "--kubeconfig", str(cluster.kubeconfig)),
            *("-f", str(ROOT / "kind" / "values.yaml"), "--set", "provider.name=none"),
            *("--set", "gateway.create=false", "--set", "httpRoute.enabled=false"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env=os.environ
        | {f"HELM_{kind}_HOME": str(helm_home / kind.lower()) for kind in ("CACHE", "CONFIG", "DATA")},
    )
    if result.returncode != 0:
        raise ClusterError(f"helm upgrade -i {RELEASE} failed:\n{result.stderr}")
    cluster.apply(dump(gateway_objects(cluster, namespace)), "-n", namespace)


def gateway_objects(cluster: LocalCluster, namespace: str) -> list[dict[str, Any]]:
    """`manifests/gateway/envoy` for `namespace`: its envoy.yaml names the Services of `default`,
    which is `epp envoy-config` with the same arguments and the namespace changed."""
    rendered = cluster.kubectl("kustomize", str(ROOT / "manifests" / "gateway" / "envoy")).stdout
    objects = [doc for doc in yaml.safe_load_all(rendered) if doc]
    for obj in objects:
        if obj["kind"] == "ConfigMap":
            text = obj["data"]["envoy.yaml"]
            obj["data"]["envoy.yaml"] = text.replace(
                ".default.svc.cluster.local", f".{namespace}.svc.cluster.local"
            )
    return objects


def record_for_e2e(cluster: LocalCluster, namespace: str) -> None:
    """The ConfigMap `lora-epp-e2e`, as kind/up.sh writes it for GATEWAY=envoy."""
    data = {"gateway": "envoy", "service": f"{namespace}/{GATEWAY}", "port": "80", "httpRoutes": "false"}
    config_map = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "lora-epp-e2e", "namespace": namespace},
        "data": data,
    }
    cluster.apply(json.dumps(config_map))


def wait_ready(cluster: LocalCluster, namespace: str, *, within_s: float = READY_WITHIN_S) -> str:
    """kind/up.sh's waits: the sims rolled out, an EPP leader Ready, the gateway rolled out, then
    one request through it; returns the gateway's URL."""
    timeout = f"--timeout={int(within_s)}s"
    for deployment in (SIMS, GATEWAY):
        cluster.kubectl(
            "rollout", "status", "-n", namespace, f"deployment/{deployment}", timeout, timeout_s=within_s + 10
        )

    def epp_ready() -> bool:
        status = cluster.get("deployment", EPP, "-n", namespace).get("status", {})
        return int(status.get("readyReplicas", 0)) >= 1

    wait_until(
        epp_ready, "an EPP leader Ready (only the leader reports Ready)", within_s=within_s, interval_s=0.5
    )
    (pod,) = cluster.get("pods", "-n", namespace, "-l", GATEWAY_LABEL)["items"]
    port = next(p["containerPort"] for p in pod["spec"]["containers"][0]["ports"] if p.get("name") == "http")
    url = f"http://{pod['status']['podIP']}:{port}"
    wait_until(
        lambda: complete(url, "medical-lora", "Hello", timeout_s=10).status == 200,
        f"a request through the gateway at {url} to succeed",
        within_s=within_s,
        interval_s=1.0,
    )
    return url


@contextlib.contextmanager
def deployed(cluster: LocalCluster, namespace: str, workdir: pathlib.Path) -> Iterator[LocalE2E]:
    """The stack in `namespace`, running until the block ends (its processes stop then; the
    objects stay, for the caller to delete with the namespace)."""
    with (
        ClusterDNS(cluster) as dns,
        PodLauncher(cluster, namespace, "", workdir / "pods", kubelet=True, dns=dns.address) as launcher,
    ):
        install(cluster, namespace, workdir)
        url = wait_ready(cluster, namespace)
        record_for_e2e(cluster, namespace)
        yield LocalE2E(cluster, namespace, url, launcher)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m testkit.local_e2e",
        description="Start a local control plane in DIR, deploy kind/up.sh's stack (GATEWAY=envoy) "
        "onto it and keep it running until Ctrl-C.",
    )
    parser.add_argument("dir", type=pathlib.Path, help="where the cluster's files, logs and Pod logs go")
    parser.add_argument("--namespace", default="default", help="where the stack goes (default: default)")
    args = parser.parse_args(argv)
    missing = missing_binaries()
    kubectl = kubectl_path()
    if missing or kubectl is None:
        print(
            f"missing: {', '.join(missing) or 'kubectl'}: run bash kind/controlplane/install.sh "
            "and bash .ci/k8s_tools.sh",
            file=sys.stderr,
        )
        return 2
    args.dir.mkdir(parents=True, exist_ok=True)
    print(f"==> starting the control plane in {args.dir / 'cluster'}", flush=True)
    cluster = LocalCluster.start(args.dir / "cluster", kubectl)
    stop = threading.Event()
    try:
        print(f"==> deploying the e2e stack into namespace {args.namespace}", flush=True)
        with deployed(cluster, args.namespace, args.dir) as stack:
            print(
                f"==> ready; gateway {stack.gateway_url}\n"
                f"    kubectl: KUBECONFIG={cluster.kubeconfig} {kubectl} get pods -n {args.namespace}\n"
                f"    Pod logs: {args.dir / 'pods'}\n"
                f"    run the end-to-end suite with:\n    {stack.pytest_command()}\n"
                "    Ctrl-C stops it all.",
                flush=True,
            )
            for signum in (signal.SIGINT, signal.SIGTERM):
                signal.signal(signum, lambda *_: stop.set())
            stop.wait()
    finally:
        print("==> stopping", flush=True)
        cluster.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
