"""The EPP behind each gateway's own ext_proc filter (kgateway, Istio, Envoy AI Gateway), in real Envoy.

Those gateways announce response processing (headers SEND, body FULL_DUPLEX_STREAMED) and give
no way to turn it off. With the gateway's access log flowing to the EPP, the EPP leaves each
stream after routing, closing it with the last routing reply in one write:

- SIGKILL of the EPP while six long responses stream: all six finish whole, FailOpen and FailClose;
- a few ext_proc messages per request (the EPP's own counters), not one per response chunk;
- against a model server that answers at once, every response arrives whole (JSON and SSE): no
  response byte is handed to a stream the EPP already closed. `benchmarks/leave_stream.py` runs
  the same check with thousands of requests.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import http.client
import itertools
import json
import urllib.request
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from epp.picker.datastore.types import FailureMode
from epp.picker.extproc.stream import BodyMode
from epp.tools.envoy.profiles import PROFILES, Gateway, apply_profile
from epp.tools.localstack import LocalStack, StackOptions
from testkit.waiting import wait_until
from tests.integration.conftest import ADAPTERS, EPP_STACK
from tests.integration.traffic import completion_request, streams_through_an_epp_kill

pytestmark = pytest.mark.integration

GATEWAYS = tuple(Gateway)


def _options(gateway: Gateway, **changes: object) -> StackOptions:
    profile = PROFILES[gateway]
    return dataclasses.replace(
        EPP_STACK,
        body_mode=BodyMode.FULL_DUPLEX_STREAMED,
        envoy_bootstrap_hook=lambda bootstrap: apply_profile(bootstrap, profile),
        **changes,  # type: ignore[arg-type]
    )


def ext_proc_counts(stack: LocalStack) -> dict[str, float]:
    """The EPP's ext_proc counters: `streams:<ending>` and `messages:<direction>`."""
    url = f"http://127.0.0.1:{stack.epp_metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    counts: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        if family.name == "inference_extension_ext_proc_streams":
            for sample in family.samples:
                counts[f"streams:{sample.labels['ending']}"] = sample.value
        elif family.name == "inference_extension_ext_proc_messages":
            for sample in family.samples:
                counts[f"messages:{sample.labels['direction']}"] = sample.value
    return counts


def leaving(stack: LocalStack) -> None:
    """Send requests until the EPP leaves their streams (the gateway's access log reached it)."""

    def left() -> bool:
        completion_request(stack, ADAPTERS[0], 2, stream=False)
        return ext_proc_counts(stack).get("streams:left-after-routing", 0) > 0

    wait_until(left, "the EPP leaves streams after routing", within_s=20, interval_s=0.2)


SLOW = dataclasses.replace(EPP_STACK.sim, inter_token_latency_s=0.01)
KILL = [
    _options(gateway, failure_mode=mode, sim=SLOW)
    for gateway, mode in itertools.product(GATEWAYS, FailureMode)
]


@pytest.mark.parametrize(
    "own_stack",
    KILL,
    indirect=True,
    ids=[f"{g.value}-{m.name}" for g, m in itertools.product(GATEWAYS, FailureMode)],
)
def test_an_epp_killed_mid_stream_cuts_no_response_and_costs_few_messages(own_stack: LocalStack) -> None:
    leaving(own_stack)
    before = ext_proc_counts(own_stack)
    requests = 20
    for index in range(requests):
        result = completion_request(own_stack, ADAPTERS[index % len(ADAPTERS)], 20, stream=index % 2 == 0)
        assert (result.status, result.whole) == (200, True)
    after = ext_proc_counts(own_stack)
    received = after["messages:received"] - before["messages:received"]
    sent = after["messages:sent"] - before["messages:sent"]
    left = after["streams:left-after-routing"] - before.get("streams:left-after-routing", 0)
    assert left == requests
    assert received / requests <= 4 and sent / requests <= 4, (received, sent)

    results = streams_through_an_epp_kill(own_stack, ADAPTERS, 150)
    assert [(r.status, r.whole, r.error) for r in results] == [(200, True, "")] * 6


INSTANT = dataclasses.replace(EPP_STACK.sim, time_to_first_token_s=0.0, inter_token_latency_s=0.0)


@pytest.mark.parametrize(
    "own_stack", [_options(g, sim=INSTANT) for g in GATEWAYS], indirect=True, ids=[g.value for g in GATEWAYS]
)
def test_no_response_byte_is_lost_when_the_model_server_answers_at_once(own_stack: LocalStack) -> None:
    leaving(own_stack)
    requests = 200  # bounded for CI; benchmarks/leave_stream.py runs thousands
    with concurrent.futures.ThreadPoolExecutor(max_workers=8) as pool:
        results = list(
            pool.map(
                lambda index: completion_request(
                    own_stack, ADAPTERS[index % len(ADAPTERS)], 3, stream=index % 2 == 0
                ),
                range(requests),
            )
        )
    broken = [(r.status, r.streamed, len(r.body), r.error) for r in results if r.status != 200 or not r.whole]
    assert broken == []
    counts = ext_proc_counts(own_stack)
    assert counts["streams:left-after-routing"] >= requests

    # Each request reached the pod the EPP picked (as metadata on kgateway and Istio, as the
    # destination header on Envoy AI Gateway).
    served = {request_id: served_by(own_stack, request_id) for request_id in (f"pick-{i}" for i in range(10))}
    by_address = {pod.address: pod.name for pod in own_stack.pods}
    picked = {
        entry["request_id"]: by_address[entry["chosen"][0]]
        for entry in decisions(own_stack)
        if entry["request_id"] in served
    }
    assert picked == served


def served_by(stack: LocalStack, request_id: str) -> str:
    """The pod that answered one completion sent with `request_id`."""
    host, port = stack.gateway_url.removeprefix("http://").rsplit(":", 1)
    connection = http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        body = json.dumps({"model": ADAPTERS[0], "prompt": "Say hello.", "max_tokens": 2})
        headers = {"content-type": "application/json", "x-request-id": request_id}
        connection.request("POST", "/v1/completions", body, headers)
        response = connection.getresponse()
        response.read()
        assert response.status == 200
        return response.getheader("x-inference-pod") or ""
    finally:
        connection.close()


def decisions(stack: LocalStack) -> list[dict[str, Any]]:
    url = f"http://127.0.0.1:{stack.epp_metrics_port}/debug/decisions"
    with urllib.request.urlopen(url, timeout=10) as response:
        entries: list[dict[str, Any]] = json.loads(response.read())["decisions"]
    return entries
