"""The EPP stops, dies and restarts while responses stream: no response is ever cut.

Through real Envoy configured as `epp envoy-config` writes it by default (the EPP sees requests
only; how each ended comes back in Envoy's gRPC access log):

- SIGKILL of the EPP while six long responses stream: all six finish whole, in FailOpen and
  FailClose, in both request body modes; afterwards FailOpen serves new requests and FailClose
  refuses them with a JSON 503;
- a rolling restart (a new EPP first, then SIGTERM to the old one, which drains) under 30
  requests/s of streamed and non-streamed traffic: every request answered 200 and whole, in
  both failure modes;
- SIGKILL under the same load in FailOpen: the only failures are the requests the EPP held at
  the kill and the few sent before Envoy saw it down (the first refused connection ejects it),
  and every request after that is served.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import time
import urllib.request

import pytest

from epp.picker.datastore.types import FailureMode
from epp.tools.envoy.bootstrap import BODY_MODES
from epp.tools.loadgen import Answer
from epp.tools.localstack import LocalStack
from testkit import faults
from tests.integration.conftest import ADAPTERS, EPP_STACK, NO_EARLY_REFUSAL, completion
from tests.integration.traffic import open_load, streams_through_an_epp_kill

pytestmark = pytest.mark.integration

SLOW_TOKENS = dataclasses.replace(EPP_STACK.sim, inter_token_latency_s=0.01)
STREAM_TOKENS = 150  # 1.5 s of streaming at 10 ms a token


KILL_MID_STREAM = [
    dataclasses.replace(EPP_STACK, failure_mode=mode, body_mode=body, sim=SLOW_TOKENS)
    for mode, body in itertools.product(FailureMode, BODY_MODES)
]


def _stack_id(options: object) -> str:
    return f"{options.failure_mode.name}-{options.body_mode.value}"  # type: ignore[attr-defined]


@pytest.mark.parametrize("own_stack", KILL_MID_STREAM, indirect=True, ids=_stack_id)
def test_an_epp_killed_mid_stream_cuts_no_response(own_stack: LocalStack) -> None:
    results = streams_through_an_epp_kill(own_stack, ADAPTERS, STREAM_TOKENS)
    assert [(r.status, r.whole, r.error) for r in results] == [(200, True, "")] * 6

    faults.wait_envoy_sees_epp_down(own_stack)
    reply = completion(own_stack, ADAPTERS[0])
    if own_stack.options.failure_mode is FailureMode.FAIL_OPEN:
        assert reply.status == 200 and reply.pod  # served round robin without the EPP
    else:
        # Refused before any pod, with an error the OpenAI SDK can read.
        assert reply.status == 503 and not reply.pod
        assert reply.headers["content-type"] == "application/json"
        error = json.loads(reply.body)["error"]
        assert error["type"] == "ServiceUnavailable" and error["code"] == 503
        assert "endpoint picker is unavailable" in error["message"]


ROLLING = [
    dataclasses.replace(
        EPP_STACK, failure_mode=mode, epp_slots=2, drain_period="2s", extra_serve_args=NO_EARLY_REFUSAL
    )
    for mode in FailureMode
]


def _decisions(stack: LocalStack) -> list[dict[str, object]]:
    url = f"http://127.0.0.1:{stack.epp_metrics_port}/debug/decisions"
    with urllib.request.urlopen(url, timeout=10) as response:
        decisions: list[dict[str, object]] = json.loads(response.read())["decisions"]
    return decisions


def _summary(results: list[Answer]) -> list[tuple[int, bool, str]]:
    return [(r.status, r.whole, r.error) for r in results if r.status != 200 or not r.whole]


@pytest.mark.parametrize("own_stack", ROLLING, indirect=True, ids=lambda o: o.failure_mode.name)
def test_a_rolling_restart_under_load_answers_every_request(own_stack: LocalStack) -> None:
    with open_load(own_stack, ADAPTERS, rate=30.0) as load:
        load.wait_sent(30)
        faults.rolling_restart_epp(own_stack)  # returns once the old EPP has drained and exited
        after_restart = load.sent()
        load.wait_sent(after_restart + 30)
        results = load.stop()
    assert _summary(results) == []
    assert len(results) >= 60
    # The new EPP routes: the requests after the restart are in its decision log, with their status.
    statuses = [d["response_status"] for d in _decisions(own_stack) if d["outcome"] == "routed"]
    assert len(statuses) >= 20 and set(statuses) <= {200, None}


@pytest.mark.parametrize(
    "own_stack",
    [dataclasses.replace(EPP_STACK, failure_mode=FailureMode.FAIL_OPEN, extra_serve_args=NO_EARLY_REFUSAL)],
    indirect=True,
    ids=["FAIL_OPEN"],
)
def test_a_killed_epp_fails_only_requests_sent_before_envoy_saw_it_down(own_stack: LocalStack) -> None:
    with open_load(own_stack, ADAPTERS, rate=30.0) as load:
        load.wait_sent(30)
        killed_at = time.monotonic()
        faults.stop_epp(own_stack)
        faults.wait_envoy_sees_epp_down(own_stack)
        detected_at = time.monotonic()
        load.wait_sent(load.sent() + 30)
        results = load.stop()
    failed = [r for r in results if r.status != 200 or not r.whole]
    assert all(r.started_at < detected_at for r in failed), _summary(failed)
    # Those the EPP held at that instant (routing, or queued while the pods were busy: how many
    # depends on how loaded the machine is), each answered only after the kill ...
    held = [r for r in failed if r.started_at < killed_at]
    assert all(r.started_at + r.e2e_s >= killed_at for r in held), _summary(held)
    # ... and the first to find its connection refused, which takes the EPP out of Envoy's
    # cluster at once: at 30 req/s one or two requests, not every one until the health check.
    assert len(failed) - len(held) <= 3, _summary(failed)
    after = [r for r in results if r.started_at >= detected_at]
    assert len(after) >= 30 and all(r.status == 200 and r.whole for r in after)
    print(
        f"SIGKILL at 30 req/s: {len(failed)} failed of {len(results)}; "
        f"{len([r for r in results if killed_at <= r.started_at < detected_at])} sent between the kill "
        f"and Envoy's detection ({detected_at - killed_at:.2f} s)"
    )
