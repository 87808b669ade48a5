"""The upstream endpoint picker (sigs.k8s.io/gateway-api-inference-extension v1.5.0 `cmd/epp`,
built by `benchmarks/upstream/install.sh`) on the same stack as ours: the local control plane,
`manifests/sim/deployment.yaml`'s Pods, the sample InferencePool, real Envoy. It is what the
side-by-side benchmarks run against; this checks it routes here at all, with the request body
mode its own Envoy configuration uses (FULL_DUPLEX_STREAMED: in BUFFERED mode it does not answer
within Envoy's message timeout).

Skipped with one line when the binary is not built (CI does not build it: it would add about five
minutes to a fresh machine's run).
"""

from __future__ import annotations

import os
import pathlib
import subprocess
from typing import Any

import pytest
import yaml

from epp.picker.extproc.stream import BodyMode
from epp.tools.envoy.bootstrap import EnvoyOptions, HostPort, Upstream, build_bootstrap, render_yaml
from epp.tools.envoy.process import EnvoyProcess
from epp.tools.localstack import epp_ready, free_ports
from testkit.localcluster import LocalCluster, dump
from testkit.podlauncher import PodLauncher
from testkit.waiting import wait_until
from tests.cluster.gateway import ask

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(300)]

ROOT = pathlib.Path(__file__).resolve().parents[2]
UPSTREAM_EPP = ROOT / ".upstream" / "bin" / "epp"
NAMESPACE = "upstream"


def documents(path: pathlib.Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def test_the_upstream_epp_routes_through_envoy_to_the_deployments_pods(
    cluster: LocalCluster, tmp_path: pathlib.Path
) -> None:
    if not UPSTREAM_EPP.exists():
        pytest.skip("upstream EPP not built: bash benchmarks/upstream/install.sh")
    cluster.kubectl("create", "namespace", NAMESPACE)
    deployment = documents(ROOT / "manifests" / "sim" / "deployment.yaml")[0]
    deployment["spec"]["replicas"] = 2
    pool = documents(ROOT / "manifests" / "samples" / "inferencepool.yaml")
    cluster.apply(dump([*pool, deployment]), "-n", NAMESPACE)
    grpc, health, metrics, listen = free_ports(4)
    try:
        with PodLauncher(cluster, NAMESPACE, "app=vllm", tmp_path, kubelet=True) as launcher:
            with (tmp_path / "upstream-epp.log").open("wb") as log:
                epp = subprocess.Popen(
                    [
                        str(UPSTREAM_EPP),
                        *("--pool-name=vllm-llama3-8b", f"--pool-namespace={NAMESPACE}"),
                        *(f"--grpc-port={grpc}", f"--grpc-health-port={health}", f"--metrics-port={metrics}"),
                        *("--secure-serving=false", "--metrics-endpoint-auth=false"),
                    ],
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env={**os.environ, "KUBECONFIG": str(cluster.kubeconfig)},  # it takes no --kubeconfig
                )
            options = EnvoyOptions(
                listen_address="127.0.0.1",
                listen_port=listen,
                upstream=Upstream.ORIGINAL_DST,
                epp=HostPort("127.0.0.1", grpc),
                epp_health_port=health,
                epp_tls=False,
                body_mode=BodyMode.FULL_DUPLEX_STREAMED,
            )
            (tmp_path / "envoy.yaml").write_text(render_yaml(build_bootstrap(options)))
            envoy = EnvoyProcess(tmp_path / "envoy.yaml", log_path=tmp_path / "envoy.log")
            try:
                wait_until(lambda: epp_ready(health), "the upstream EPP ready", within_s=60)
                wait_until(lambda: len(launcher.running()) == 2, "both sim pods running", within_s=60)
                envoy.start()
                gateway = f"http://127.0.0.1:{listen}"
                # It learns the Pods from its own watch once they are Ready (their probes pass
                # after the processes start): the first answer may be 503 until then.
                wait_until(
                    lambda: ask(gateway)[0] == 200, "a request routed by the upstream EPP", within_s=60
                )
                served = [ask(gateway) for _ in range(20)]
            finally:
                envoy.stop()
                epp.terminate()
                epp.wait(timeout=30)
            running = set(launcher.running())
    finally:
        cluster.kubectl("delete", "namespace", NAMESPACE, "--wait=false")
    assert all(status == 200 for status, _ in served), served
    assert {pod for _, pod in served} <= running
