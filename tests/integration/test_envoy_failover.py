"""Failures a gateway meets: a pod dies, the EPP dies; FailOpen serves, FailClose refuses."""

from __future__ import annotations

import dataclasses

import pytest

from epp.picker.datastore.types import FailureMode
from epp.picker.scheduling.policies import DEFAULT_CONFIG
from epp.tools.envoy.config import BodyMode
from epp.tools.localstack import LocalStack
from tests.integration.conftest import ADAPTERS, EPP_STACK, completion
from tests.support import faults

pytestmark = pytest.mark.integration

WITH_FALLBACKS = dataclasses.replace(
    EPP_STACK,
    extra_serve_args=(
        "--config-text",
        DEFAULT_CONFIG.replace("maxNumOfEndpoints: 1", "maxNumOfEndpoints: 3"),
    ),
)


@pytest.mark.parametrize("own_stack", [WITH_FALLBACKS], indirect=True, ids=["fallbacks-configured"])
def test_a_dead_pod_is_retried_around_then_no_longer_picked(own_stack: LocalStack) -> None:
    first = completion(own_stack, ADAPTERS[0])
    assert first.status == 200
    faults.kill_pod(own_stack, first.pod)
    # At once (before any scrape noticed): Envoy retries along the EPP's fallback list.
    replies = [completion(own_stack, ADAPTERS[0]) for _ in range(10)]
    assert [r.status for r in replies] == [200] * 10
    assert first.pod not in {r.pod for r in replies}
    # Many requests later, still never the dead pod, and every adapter is served.
    for adapter in ADAPTERS * 3:
        reply = completion(own_stack, adapter)
        assert reply.status == 200
        assert reply.pod != first.pod


FAIL_OPEN = [
    dataclasses.replace(EPP_STACK, failure_mode=FailureMode.FAIL_OPEN, body_mode=mode) for mode in BodyMode
]


@pytest.mark.parametrize("own_stack", FAIL_OPEN, indirect=True, ids=[m.value for m in BodyMode])
def test_fail_open_serves_when_the_epp_is_down(own_stack: LocalStack) -> None:
    assert completion(own_stack, ADAPTERS[0]).status == 200
    faults.stop_epp(own_stack)
    faults.wait_envoy_sees_epp_down(own_stack)
    replies = [completion(own_stack, adapter) for adapter in ADAPTERS]
    assert [r.status for r in replies] == [200] * len(ADAPTERS)
    # Round robin over the pool's pods while the EPP is away.
    assert {r.pod for r in replies} == {p.name for p in own_stack.pods}
    faults.restart_epp(own_stack)
    assert completion(own_stack, ADAPTERS[0]).status == 200


FAIL_CLOSE = [dataclasses.replace(EPP_STACK, body_mode=mode) for mode in BodyMode]


@pytest.mark.parametrize("own_stack", FAIL_CLOSE, indirect=True, ids=[m.value for m in BodyMode])
def test_fail_close_refuses_when_the_epp_is_down(own_stack: LocalStack) -> None:
    assert completion(own_stack, ADAPTERS[0]).status == 200
    faults.stop_epp(own_stack)
    faults.wait_envoy_sees_epp_down(own_stack)
    replies = [completion(own_stack, adapter) for adapter in ADAPTERS]
    assert all(500 <= r.status < 600 for r in replies), [r.status for r in replies]
    assert not any(r.pod for r in replies)  # no pod was reached
