"""Requests through real Envoy and `epp serve` reach the real vLLM pod the EPP chose.

Where a request went is read three ways that do not depend on each other: the EPP's pick
(the destination header Envoy routed on, echoed back by Envoy), the address Envoy dialled,
and the servers' own `vllm:request_success_total` counters, which must move by exactly one
on the chosen pod and not at all on the other.
"""

from __future__ import annotations

import itertools
import pathlib
from collections.abc import Iterator

import pytest

from epp.tools.envoy.bootstrap import RoutingMode
from testkit.waiting import poll_until
from tests.realvllm.client import ADAPTERS, BASE_MODEL, RealPod, completion, idle, successes
from tests.realvllm.gateway import EPP_CHOICE_HEADER, UPSTREAM_HOST_HEADER, Gateway

MODELS = (BASE_MODEL, *ADAPTERS)
ROUNDS = 3


@pytest.fixture(scope="module")
def epp_gateway(real_pods: list[RealPod], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    with Gateway(real_pods, pathlib.Path(tmp_path_factory.mktemp("gw-epp"))) as gateway:
        yield gateway


def test_each_request_reaches_the_pod_the_epp_chose(real_pods: list[RealPod], epp_gateway: Gateway) -> None:
    by_address = {pod.address: pod for pod in real_pods}
    assert poll_until(lambda: idle(real_pods), within_s=60)
    chosen: list[str] = []
    for model in itertools.chain.from_iterable(itertools.repeat(MODELS, ROUNDS)):
        before = {pod.address: successes(pod) for pod in real_pods}
        reply = completion(epp_gateway.url, model, 3)
        assert reply.status == 200, (reply.status, reply.body[:300], epp_gateway.epp_log_tail())
        assert reply.json()["model"] == model  # vLLM served the adapter asked for
        pick = reply.headers.get(EPP_CHOICE_HEADER, "").split(",")[0].strip()
        assert pick in by_address, f"EPP pick {pick!r} is not a pool pod"
        assert reply.headers.get(UPSTREAM_HOST_HEADER) == pick  # Envoy dialled the EPP's pick
        expected = {address: count + (1 if address == pick else 0) for address, count in before.items()}

        def counted(expected: dict[str, float] = expected) -> bool:
            return {pod.address: successes(pod) for pod in real_pods} == expected

        assert poll_until(counted, within_s=10), (
            f"request counters moved elsewhere: before {before}, expected {expected}"
        )
        chosen.append(pick)
    assert len(chosen) == ROUNDS * len(MODELS)


def test_an_adapter_keeps_its_pod_when_the_pool_is_quiet(
    real_pods: list[RealPod], epp_gateway: Gateway
) -> None:
    """Sequential requests for one adapter stay on one pod: its slot is warm there."""
    assert poll_until(lambda: idle(real_pods), within_s=60)
    picks = set()
    for _ in range(6):
        reply = completion(epp_gateway.url, "lora-2", 2)
        assert reply.status == 200, reply.body[:300]
        picks.add(reply.headers.get(EPP_CHOICE_HEADER, "").split(",")[0])
    assert len(picks) == 1, f"lora-2 bounced between pods: {picks}"


def test_round_robin_gateway_spreads_requests(real_pods: list[RealPod], tmp_path: pathlib.Path) -> None:
    """The baseline the affinity test compares against really alternates between the pods."""
    with Gateway(real_pods, tmp_path, mode=RoutingMode.ROUND_ROBIN) as gateway:
        hosts = [completion(gateway.url, "lora-0", 2).headers.get(UPSTREAM_HOST_HEADER) for _ in range(4)]
    assert set(hosts) == {pod.address for pod in real_pods}
