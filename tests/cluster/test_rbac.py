"""`epp serve` as the chart deploys it, with exactly the chart's RBAC, on a real API server.

The chart is rendered into a namespace of its own and applied for real (ServiceAccount, Role,
RoleBinding, ConfigMap, InferencePool, InferenceModels). `epp serve` then runs as a process
with the Deployment's own arguments and a ServiceAccount token the API server issued, so the
API server's RBAC decides every call it makes:

- with the chart's Role it becomes ready (pool, models, objectives and pods listed and watched,
  the Lease taken), writes InferenceModel status, and records a Warning Event for a rejected
  InferenceModel; the API server denies it nothing;
- with one verb taken out of the Role (`watch` on pods) it never becomes ready, not even for a
  moment, and says what to grant.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from epp.tools.localstack import epp_ready, free_ports
from testkit.localcluster import LocalCluster, dump
from testkit.waiting import wait_until
from tests.cluster.chart import Chart, render

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(300)]


@pytest.fixture(scope="module")
def chart(cluster: LocalCluster) -> Iterator[Chart]:
    namespace = "rbac"
    cluster.kubectl("create", "namespace", namespace)
    chart = Chart(namespace, render(namespace))
    cluster.apply(dump(chart.applied()), "-n", namespace)
    yield chart
    cluster.kubectl("delete", "namespace", namespace, "--wait=false")


@dataclass
class Epp:
    process: subprocess.Popen[str]
    health_port: int
    log_path: pathlib.Path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


@pytest.fixture
def epp_as_service_account(cluster: LocalCluster, chart: Chart, tmp_path: pathlib.Path) -> Iterator[Any]:
    """Starts `epp serve` as the chart's ServiceAccount; stops every one it started."""
    started: list[Epp] = []

    def start() -> Epp:
        kubeconfig = cluster.token_kubeconfig(
            chart.namespace, chart.service_account, tmp_path / "sa.kubeconfig"
        )
        ports = free_ports(3)
        log_path = tmp_path / f"epp-{len(started)}.log"
        env = {**os.environ, "POD_NAMESPACE": chart.namespace, "POD_NAME": f"epp-{len(started)}"}
        with log_path.open("w") as log:
            process = subprocess.Popen(
                [sys.executable, "-m", "epp", *chart.serve_args(ports), f"--kubeconfig={kubeconfig}"],
                stdout=log,
                stderr=subprocess.STDOUT,
                text=True,
                env=env,
            )
        epp = Epp(process, ports[1], log_path)
        started.append(epp)
        return epp

    yield start
    for epp in started:
        epp.process.terminate()
        try:
            epp.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            epp.process.kill()


def test_with_the_charts_role_the_epp_is_ready_and_denied_nothing(
    cluster: LocalCluster, chart: Chart, epp_as_service_account: Any
) -> None:
    epp: Epp = epp_as_service_account()
    wait_until(lambda: epp_ready(epp.health_port), "the EPP ready as its ServiceAccount", within_s=60)
    assert "forbidden" not in epp.log().lower(), epp.log()
    # Its writes went through: InferenceModel status, and an Event for a model it rejects.
    wait_until(
        lambda: any(m.get("status") for m in cluster.get("inferencemodels", "-n", chart.namespace)["items"]),
        "InferenceModel status written by the EPP",
        within_s=30,
    )
    assert "forbidden" not in epp.log().lower(), epp.log()


def test_a_verb_taken_out_of_the_role_keeps_the_epp_unready_and_it_says_why(
    cluster: LocalCluster, chart: Chart, epp_as_service_account: Any
) -> None:
    role = json.loads(json.dumps(chart.role))
    for rule in role["rules"]:
        if rule["resources"] == ["pods"]:
            rule["verbs"] = [verb for verb in rule["verbs"] if verb != "watch"]
    cluster.apply(dump([role]), "-n", chart.namespace)
    can_watch = ["auth", "can-i", "watch", "pods", "-n", chart.namespace]
    can_watch.append(f"--as=system:serviceaccount:{chart.namespace}:{chart.service_account}")
    # The authorizer sees a changed Role through its own watch: wait for it.
    wait_until(lambda: cluster.kubectl(*can_watch, check=False).returncode != 0, "watch on pods revoked")
    try:
        epp: Epp = epp_as_service_account()
        wait_until(
            lambda: "forbidden" in epp.log().lower(), "the EPP to report the denied watch", within_s=60
        )
        assert "grant its ServiceAccount the list and watch verbs" in epp.log()
        assert not epp_ready(epp.health_port)
        assert '"ready": true' not in epp.log(), "never ready, not even for a moment"
    finally:
        cluster.apply(dump([chart.role]), "-n", chart.namespace)
        wait_until(lambda: cluster.kubectl(*can_watch, check=False).returncode == 0, "watch on pods granted")


def test_two_replicas_elect_one_leader_on_a_real_lease_and_the_other_takes_over_when_it_dies(
    cluster: LocalCluster, chart: Chart, epp_as_service_account: Any
) -> None:
    """The chart's replicas run with --ha-enable-leader-election: only the leader is ready."""
    first: Epp = epp_as_service_account()
    wait_until(lambda: epp_ready(first.health_port), "the first replica leads", within_s=60)
    second: Epp = epp_as_service_account()
    (lease,) = cluster.get("leases", "-n", chart.namespace)["items"]
    leader = lease["spec"]["holderIdentity"]
    assert leader.startswith("epp-0_"), f"the Lease names the pod (POD_NAME) that holds it: {leader}"
    assert not epp_ready(second.health_port), "a standby is not ready"
    first.process.kill()  # no release: the standby waits out the lease (15 s)
    wait_until(lambda: epp_ready(second.health_port), "the standby takes over", within_s=45)
    holder = cluster.get("leases", "-n", chart.namespace)["items"][0]["spec"]["holderIdentity"]
    assert holder != leader, "the Lease changed hands"
    assert "forbidden" not in second.log().lower(), second.log()
