"""Leader election between two real `LeaderElector`s over one Lease on an API server."""

from __future__ import annotations

import asyncio
import contextlib
import datetime

import pytest

from epp.clock import SystemClock
from epp.kube.leader import API_CALLS, LeaderElector, LeaseClaim, LeaseTiming, lease_name_for
from testkit.waiting import eventually
from tests.fakekube.plugin import KubeEnv

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

LEASE_DURATION_S = 2
RENEW_DEADLINE_S = 1.0
RETRY_PERIOD_S = 0.2


def elector(env: KubeEnv, identity: str) -> LeaderElector:
    return LeaderElector(
        claim=LeaseClaim(
            name=lease_name_for(env.namespace, "pool-a"), namespace=env.namespace, identity=identity
        ),
        kubeconfig=env.kubeconfig,
        clock=SystemClock(),
        timing=LeaseTiming(
            lease_duration_s=LEASE_DURATION_S,
            renew_deadline_s=RENEW_DEADLINE_S,
            retry_period_s=RETRY_PERIOD_S,
        ),
    )


async def stop(task: asyncio.Task[None]) -> None:
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


def test_lease_name_matches_upstream() -> None:
    assert lease_name_for("ns", "pool") == "epp-ns-pool.gateway-api-inference-extension.sigs.k8s.io"


async def test_exactly_one_leader_and_release_on_shutdown_hands_over_at_once(kube: KubeEnv) -> None:
    a, b = elector(kube, "replica-a"), elector(kube, "replica-b")
    changes: list[tuple[str, bool]] = []
    a.on_change(lambda leader: changes.append(("a", leader)))
    task_a = asyncio.create_task(a.run())
    await eventually(lambda: a.is_leader, "first replica leads", within_s=3)
    task_b = asyncio.create_task(b.run())
    try:
        await asyncio.sleep(LEASE_DURATION_S * 1.5)
        assert a.is_leader and not b.is_leader, "a live leader keeps the lease"
        loop = asyncio.get_running_loop()
        await stop(task_a)  # graceful: releases the lease
        released_at = loop.time()
        lease = kube.get(
            "coordination.k8s.io/v1", "Lease", kube.namespace, lease_name_for(kube.namespace, "pool-a")
        )
        assert lease is not None and not lease["spec"].get("holderIdentity")
        await eventually(lambda: b.is_leader, "second replica takes over", within_s=3)
        assert loop.time() - released_at < LEASE_DURATION_S, "no need to wait out the lease after a release"
        assert changes == [("a", True), ("a", False)]
    finally:
        await stop(task_b)
        await stop(task_a)


async def test_a_crashed_leader_loses_the_lease_within_one_duration(kube: KubeEnv) -> None:
    # A leader that crashed: its Lease record is fresh, and nobody will ever renew it.
    lease_name = lease_name_for(kube.namespace, "pool-a")
    kube.put(
        {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": lease_name, "namespace": kube.namespace},
            "spec": {
                "holderIdentity": "replica-crashed",
                "leaseDurationSeconds": LEASE_DURATION_S,
                "renewTime": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
                "leaseTransitions": 3,
            },
        }
    )
    b = elector(kube, "replica-b")
    loop = asyncio.get_running_loop()
    started_at = loop.time()
    task_b = asyncio.create_task(b.run())
    try:
        await asyncio.sleep(LEASE_DURATION_S / 2)
        assert not b.is_leader, "a fresh lease is respected"
        await eventually(lambda: b.is_leader, "takeover after expiry", within_s=LEASE_DURATION_S + 1.0)
        assert loop.time() - started_at <= LEASE_DURATION_S + 3 * RETRY_PERIOD_S
        lease = kube.get("coordination.k8s.io/v1", "Lease", kube.namespace, lease_name)
        assert lease is not None
        assert lease["spec"]["holderIdentity"] == "replica-b"
        assert lease["spec"]["leaseTransitions"] == 4
    finally:
        await stop(task_b)
    fake = kube.fake
    if fake is not None:
        seen = {(c.group, c.resource, c.verb) for c in fake.calls}
        assert seen <= API_CALLS


async def test_bad_timing_is_refused(kube: KubeEnv) -> None:
    with pytest.raises(ValueError, match="retry_period_s"):
        LeaderElector(
            claim=LeaseClaim(name="x", namespace=kube.namespace, identity="a"),
            kubeconfig=kube.kubeconfig,
            clock=SystemClock(),
            timing=LeaseTiming(lease_duration_s=1, renew_deadline_s=2),
        )
