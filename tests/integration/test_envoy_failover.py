"""Failures a gateway meets: a pod dies, the EPP dies; FailOpen serves, FailClose refuses.

With the request body mode `epp envoy-config` generates by default (BUFFERED), a SIGKILL of the
EPP under load in FailOpen loses nothing: Envoy still holds the body of every request the EPP
was routing, and sends it on without a pick.
"""

from __future__ import annotations

import dataclasses

import pytest

from epp.picker.datastore.types import FailureMode
from epp.picker.scheduling.policies import DEFAULT_CONFIG
from epp.tools.envoy.bootstrap import BODY_MODES, EnvoyOptions
from epp.tools.localstack import LocalStack
from testkit import faults
from tests.integration.conftest import ADAPTERS, EPP_STACK, completion
from tests.integration.traffic import open_load

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
    dataclasses.replace(EPP_STACK, failure_mode=FailureMode.FAIL_OPEN, body_mode=mode) for mode in BODY_MODES
]


@pytest.mark.parametrize("own_stack", FAIL_OPEN, indirect=True, ids=[m.value for m in BODY_MODES])
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


FAIL_CLOSE = [dataclasses.replace(EPP_STACK, body_mode=mode) for mode in BODY_MODES]


@pytest.mark.parametrize("own_stack", FAIL_CLOSE, indirect=True, ids=[m.value for m in BODY_MODES])
def test_fail_close_refuses_when_the_epp_is_down(own_stack: LocalStack) -> None:
    assert completion(own_stack, ADAPTERS[0]).status == 200
    faults.stop_epp(own_stack)
    faults.wait_envoy_sees_epp_down(own_stack)
    replies = [completion(own_stack, adapter) for adapter in ADAPTERS]
    assert all(500 <= r.status < 600 for r in replies), [r.status for r in replies]
    assert not any(r.pod for r in replies)  # no pod was reached


GENERATED_FAIL_OPEN = dataclasses.replace(
    EPP_STACK, failure_mode=FailureMode.FAIL_OPEN, body_mode=EnvoyOptions().body_mode
)


@pytest.mark.timeout(180)
@pytest.mark.parametrize("own_stack", [GENERATED_FAIL_OPEN], indirect=True, ids=["generated-default"])
def test_killing_the_epp_under_load_loses_no_request_in_fail_open(own_stack: LocalStack) -> None:
    with open_load(own_stack, ADAPTERS, rate=30.0, max_requests=600) as load:
        load.wait_sent(30)
        faults.stop_epp(own_stack)  # SIGKILL, mid-routing for whatever it was routing
        faults.wait_envoy_sees_epp_down(own_stack)
        load.wait_sent(load.sent() + 30)  # and a second of requests with the EPP gone
        results = load.stop()
    failed = [(r.status, r.whole, r.error) for r in results if r.status != 200 or not r.whole]
    print(f"EPP killed at 30 req/s, generated default config: {len(failed)} failed of {len(results)}")
    assert failed == []
    assert len(results) >= 60
