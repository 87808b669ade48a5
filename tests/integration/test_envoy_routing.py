"""Requests through a real Envoy land where the EPP says, in both body modes, streams intact."""

from __future__ import annotations

import collections
import dataclasses
import json

import pytest

from epp.tools.localstack import LocalStack
from tests.integration.conftest import ADAPTERS, EPP_STACK, completion, post

pytestmark = pytest.mark.integration

BODY_MODES = ["fdx_stack", "buffered_stack"]


@pytest.fixture(params=BODY_MODES, ids=["full-duplex-streamed", "buffered"])
def stack(request: pytest.FixtureRequest) -> LocalStack:
    found: LocalStack = request.getfixturevalue(request.param)
    return found


def test_each_adapter_sticks_to_the_pod_that_loaded_it(stack: LocalStack) -> None:
    before = stack.adapter_loads()
    pods_by_adapter: dict[str, set[str]] = collections.defaultdict(set)
    for _ in range(3):
        for adapter in ADAPTERS[:2]:
            reply = completion(stack, adapter)
            assert reply.status == 200, reply.body
            pods_by_adapter[adapter].add(reply.pod)
    for adapter, pods in pods_by_adapter.items():
        assert len(pods) == 1, f"{adapter} served by {pods}"
    after = stack.adapter_loads()
    # Six requests, at most one load per adapter (none if an earlier test left it loaded).
    for adapter in ADAPTERS[:2]:
        assert after.get(adapter, 0) - before.get(adapter, 0) <= 1, (before, after)


def test_the_response_is_the_pods_completion(stack: LocalStack) -> None:
    reply = completion(stack, ADAPTERS[2], max_tokens=5)
    assert reply.status == 200
    payload = reply.json()
    assert isinstance(payload, dict)
    assert payload["object"] == "text_completion"
    assert payload["model"] == ADAPTERS[2]
    assert payload["usage"]["completion_tokens"] == 5
    assert reply.pod in {pod.name for pod in stack.pods}


def test_streaming_sse_passes_through_intact(stack: LocalStack) -> None:
    body = {
        "model": ADAPTERS[3],
        "messages": [{"role": "user", "content": "Count to five."}],
        "max_tokens": 6,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    reply = post(f"{stack.gateway_url}/v1/chat/completions", body)
    assert reply.status == 200, reply.body
    assert reply.headers["content-type"].startswith("text/event-stream")
    events = [line[len("data: ") :] for line in reply.body.decode().splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(event) for event in events[:-1]]
    assert all(chunk["object"] == "chat.completion.chunk" for chunk in chunks)
    assert chunks[-1]["usage"]["completion_tokens"] == 6
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
    assert text


def test_a_large_body_is_forwarded_whole(stack: LocalStack) -> None:
    prompt = "word " * 60_000  # 300 kB: several 62000-byte chunks each way
    reply = completion(stack, ADAPTERS[0], prompt=prompt, max_tokens=1)
    assert reply.status == 200, reply.body[:300]
    payload = reply.json()
    assert isinstance(payload, dict)
    assert payload["usage"]["prompt_tokens"] >= 60_000


def test_epp_routing_loads_adapters_less_often_than_round_robin(
    fdx_stack: LocalStack, round_robin_stack: LocalStack
) -> None:
    plan = [ADAPTERS[i % len(ADAPTERS)] for i in range(24)]
    before_epp = sum(fdx_stack.adapter_loads().values())
    for stack in (fdx_stack, round_robin_stack):
        for adapter in plan:
            assert completion(stack, adapter).status == 200
    epp_loads = sum(fdx_stack.adapter_loads().values()) - before_epp
    round_robin_loads = sum(round_robin_stack.adapter_loads().values())
    # 4 adapters, 3 pods with 2 slots each: affinity needs at most a few loads; round robin
    # cycles adapters through every pod.
    assert epp_loads <= len(ADAPTERS)
    assert round_robin_loads > 2 * epp_loads


@pytest.mark.parametrize(
    "own_stack", [dataclasses.replace(EPP_STACK, pods=1, epp_tls=True)], indirect=True, ids=["epp-tls"]
)
def test_envoy_reaches_the_epp_over_its_default_self_signed_tls(own_stack: LocalStack) -> None:
    reply = completion(own_stack, ADAPTERS[0])
    assert reply.status == 200, reply.body
    assert reply.pod == own_stack.pods[0].name
