"""The end-to-end checks. Each takes a `Stack` and asserts what a user of the gateway sees.

The first four mirror what the Gateway API Inference Extension conformance suite asks of an
endpoint picker; the rest are lora-epp's own promises. Every loop here is bounded in count
and in time; no check asserts on latency.
"""

from __future__ import annotations

import collections
import random
from collections.abc import Callable
from typing import TypeVar

import pytest

from e2e.client import Reply, complete, complete_many
from e2e.stack import Stack, finished_from_log, picks_from_log
from testkit.waiting import eventually_value

T = TypeVar("T")


def _ok(replies: list[Reply]) -> list[Reply]:
    bad = [(r.status, r.body[:200]) for r in replies if r.status != 200]
    assert not bad, f"{len(bad)} of {len(replies)} requests failed: {bad[:3]}"
    return replies


def _settled(stack: Stack, *, count: int, avoid_pod: str = "", timeout_s: float = 60.0) -> list[Reply]:
    """`count` requests in a row that all succeed (and none from `avoid_pod`), within `timeout_s`."""

    def probe() -> list[Reply] | None:
        replies = complete_many(stack.gateway_url, [stack.adapters[0]] * count, concurrency=2)
        if all(r.status == 200 and r.pod != avoid_pod for r in replies):
            return replies
        return None

    return eventually_value(probe, within_s=timeout_s, what=f"{count} clean requests in a row")


# -- what the conformance suite checks -----------------------------------------------------------


def check_requests_follow_the_epp_pick(stack: Stack) -> None:
    """Each request is served by exactly the endpoint the EPP picked for it."""
    before = len(picks_from_log(stack.epp_log_lines()))
    replies = [complete(stack.gateway_url, adapter) for adapter in list(stack.adapters) * 3]
    _ok(replies)
    endpoints = stack.endpoints()
    picks = picks_from_log(stack.epp_log_lines())[before:]
    assert picks, "the EPP logged no picks (it must run with --v=4 or more)"
    by_id = dict(picks)
    if all(r.request_id in by_id for r in replies):
        picked = [by_id[r.request_id] for r in replies]
    else:
        # Some gateways replace the client's x-request-id; requests were sent one at a time,
        # so the EPP's picks are in request order.
        assert len(picks) == len(replies), f"{len(picks)} picks logged for {len(replies)} requests"
        picked = [destination for _, destination in picks]
    for reply, destination in zip(replies, picked, strict=True):
        assert reply.pod in endpoints, f"served by {reply.pod!r}, not a pod of the pool {sorted(endpoints)}"
        assert endpoints[reply.pod] == destination.split(",")[0], (
            f"EPP picked {destination} but {reply.pod} ({endpoints[reply.pod]}) served the request"
        )


def check_the_epp_learns_how_requests_end(stack: Stack) -> None:
    """The EPP learns that each routed request finished, with its status and the pod that served
    it (from the gateway's access log, or from the response passing through the EPP), which its
    in-flight counts and latency metrics depend on."""
    picks_before = len(picks_from_log(stack.epp_log_lines()))
    replies = _ok([complete(stack.gateway_url, adapter) for adapter in stack.adapters])
    endpoints = stack.endpoints()
    # The ids the EPP routed these requests under (a gateway may replace the client's
    # x-request-id); sent one at a time, so in request order.
    routed = [request_id for request_id, _ in picks_from_log(stack.epp_log_lines())[picks_before:]]
    assert len(routed) == len(replies), f"{len(routed)} picks logged for {len(replies)} requests (--v=4)"

    def probe() -> dict[str, dict[str, object]] | None:
        finished = dict(finished_from_log(stack.epp_log_lines()))
        return finished if all(request_id in finished for request_id in routed) else None

    finished = eventually_value(probe, within_s=30, what="the EPP to log every request finished (--v=4)")
    for reply, request_id in zip(replies, routed, strict=True):
        entry = finished[request_id]
        assert entry["status"] == 200, entry
        assert entry["finished_by"] in ("access-log", "response"), entry
        assert entry["served"] in (None, endpoints[reply.pod]), (entry, reply.pod)


def check_the_gateways_access_log_finishes_requests(stack: Stack) -> None:
    """On a gateway that sends the EPP its gRPC access log, entries finish the requests the EPP
    routed: `inference_extension_request_finished_total{source="access-log"}` moves after traffic."""
    if not stack.gateway_access_log:
        pytest.skip("this gateway sends no gRPC access log (agentgateway: OTLP logs only)")
    before = stack.epp_finished_by("access-log")
    requests = 3 * len(stack.adapters)
    _ok(complete_many(stack.gateway_url, list(stack.adapters) * 3, concurrency=2))
    # Entries are batched (every 1 s at Envoy's default) and sent after each response ends.
    moved = eventually_value(
        lambda: delta if (delta := stack.epp_finished_by("access-log") - before) > 0 else None,
        within_s=30,
        what='inference_extension_request_finished_total{source="access-log"} to move',
    )
    assert moved <= requests, f"{moved} finished from the access log for {requests} requests sent"


def check_fail_open_serves_without_the_epp(stack: Stack) -> None:
    """A FailOpen pool keeps answering 200 while its EPP is gone, and routing resumes after."""
    if not stack.fail_open:
        pytest.skip("the pool is FailClose")
    with stack.epp_stopped():
        replies = _ok(complete_many(stack.gateway_url, [stack.adapters[0]] * 10, concurrency=2))
        assert {r.pod for r in replies} <= set(stack.endpoints())
    _settled(stack, count=5)


def check_weighted_split_across_two_pools(stack: Stack) -> None:
    """An HTTPRoute with two weighted InferencePool backends splits traffic by weight."""
    if stack.split is None:
        pytest.skip("this stack has a single pool")
    requests = 100
    with stack.split() as split:
        replies = _ok(
            complete_many(
                stack.gateway_url, [stack.adapters[0]] * requests, headers=split.headers, concurrency=4
            )
        )
        served = collections.Counter(split.pool_of_pod(r.pod) for r in replies)
    total_weight = sum(split.weights.values())
    for pool, weight in split.weights.items():
        expected = requests * weight / total_weight
        # ±5 standard deviations of a binomial draw: fails on a broken split, not on bad luck.
        spread = 5 * (requests * (weight / total_weight) * (1 - weight / total_weight)) ** 0.5
        assert abs(served[pool] - expected) <= spread, (
            f"{pool}: {served[pool]} of {requests}, want ≈{expected:.0f}"
        )


# -- lora-epp's own promises ----------------------------------------------------------------------


def check_applied_inference_model_takes_effect(stack: Stack) -> None:
    """A new InferenceModel is routable (to its target adapter) without a restart, and gone
    again once deleted."""
    name, target = "e2e-alias", stack.adapters[-1]
    assert complete(stack.gateway_url, name).status == 404
    stack.apply_inference_model(name, name, [target])
    try:
        reply = eventually_value(
            lambda: r if (r := complete(stack.gateway_url, name)).status == 200 else None,
            within_s=30,
            what=f"model {name} to be served",
        )
        assert reply.model == target, f"served as {reply.model!r}, want the target adapter {target!r}"
    finally:
        stack.delete_inference_model(name)
    eventually_value(
        lambda: True if complete(stack.gateway_url, name).status == 404 else None,
        within_s=30,
        what=f"model {name} to be unknown again",
    )


def _adapter_workload(adapters: list[str], requests: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return [rng.choice(adapters) for _ in range(requests)]


def check_adapter_affinity_cuts_swaps(stack: Stack) -> None:
    """The same adapter mix causes far fewer adapter loads through the EPP than through plain
    load balancing over the same kind of pods."""
    baseline = stack.baseline
    if baseline is None:
        pytest.skip("this stack has no plain load-balanced path to compare with")
    workload = _adapter_workload(list(stack.adapters), requests=120, seed=7)
    before = baseline.adapter_loads()
    _ok(complete_many(baseline.url, workload, headers=baseline.headers, concurrency=4))
    baseline_loads = baseline.adapter_loads() - before
    before = stack.adapter_loads()
    _ok(complete_many(stack.gateway_url, workload, concurrency=4))
    epp_loads = stack.adapter_loads() - before
    assert baseline_loads > 0, "the baseline never swapped adapters: the workload does not test anything"
    assert epp_loads <= 0.5 * baseline_loads, (
        f"adapter loads: EPP {epp_loads}, plain load balancing {baseline_loads}"
    )


def check_deleted_pod_is_no_longer_picked(stack: Stack) -> None:
    """After a pod is deleted, requests keep succeeding and none goes to it."""
    endpoints = stack.endpoints()
    assert len(endpoints) >= 2, f"need two pods, have {sorted(endpoints)}"
    _ok(complete_many(stack.gateway_url, list(stack.adapters) * 2, concurrency=2))
    victim = sorted(endpoints)[0]
    stack.delete_pod(victim)
    _settled(stack, count=20, avoid_pod=victim)
    assert victim not in stack.endpoints()


def check_ha_failover(stack: Stack) -> None:
    """With two EPP replicas, killing the leader hands routing to the other replica: requests
    are picked by an EPP again (its pick log, `--v=4`), not only answered."""
    if stack.kill_epp_leader is None:
        pytest.skip("this stack runs a single EPP replica")
    _ok(complete_many(stack.gateway_url, [stack.adapters[0]] * 5, concurrency=1))
    stack.kill_epp_leader()

    def routed_by_the_new_leader() -> list[Reply] | None:
        """10 requests that all succeed and were each picked by an EPP (its pick log), not
        passed around it: with FailOpen the gateway answers 200 with no EPP at all."""
        before = len(picks_from_log(stack.epp_log_lines()))
        replies = complete_many(stack.gateway_url, [stack.adapters[0]] * 10, concurrency=2)
        picked = len(picks_from_log(stack.epp_log_lines())) - before
        return replies if all(r.status == 200 for r in replies) and picked >= len(replies) else None

    # One lease duration (15 s by default) plus the gateway noticing the new ready endpoint.
    eventually_value(routed_by_the_new_leader, within_s=90, what="requests routed by the new leader")


# Routing checks first, then the disruptive ones (EPP stopped, pod deleted, leader killed).
CHECKS: dict[str, Callable[[Stack], None]] = {
    "follow-pick": check_requests_follow_the_epp_pick,
    "request-finished": check_the_epp_learns_how_requests_end,
    "access-log-finishes": check_the_gateways_access_log_finishes_requests,
    "apply-inference-model": check_applied_inference_model_takes_effect,
    "adapter-affinity": check_adapter_affinity_cuts_swaps,
    "weighted-split": check_weighted_split_across_two_pools,
    "fail-open": check_fail_open_serves_without_the_epp,
    "pod-deletion": check_deleted_pod_is_no_longer_picked,
    "ha-failover": check_ha_failover,
}
