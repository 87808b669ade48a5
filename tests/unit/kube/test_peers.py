"""`--peer-selector`: which Pods count as peer replicas."""

from __future__ import annotations

from typing import Any

from epp.kube.peers import replica_ips


def pod(ip: str | None, *, phase: str = "Running", deleting: bool = False) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": f"epp-{ip}"}
    if deleting:
        metadata["deletionTimestamp"] = "2026-12-07T20:00:00Z"
    status: dict[str, Any] = {"phase": phase}
    if ip is not None:
        status["podIP"] = ip
    return {"metadata": metadata, "status": status}


def test_starting_and_running_replicas_count_ready_or_not() -> None:
    assert replica_ips([pod("10.0.0.1"), pod("10.0.0.2", phase="Pending"), pod("fd00::3")]) == [
        "10.0.0.1",
        "10.0.0.2",
        "fd00::3",
    ]


def test_replicas_being_deleted_ended_or_without_an_ip_do_not() -> None:
    pods = [
        pod("10.0.0.1", deleting=True),
        pod("10.0.0.2", phase="Succeeded"),
        pod("10.0.0.3", phase="Failed"),
        pod(None, phase="Pending"),
        pod("10.0.0.4"),
        pod("10.0.0.4"),  # a reused IP: one peer
    ]
    assert replica_ips(pods) == ["10.0.0.4"]
