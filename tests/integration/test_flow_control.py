"""Flow control through real Envoy: requests wait in the EPP when no pod has a LoRA slot for them.

Two `epp sim` pods with one LoRA slot each and six adapters: at most two adapters run at once, so
concurrent requests for the others wait in the EPP's queue (`default` policy: flow control on,
gated per pod on request headroom and LoRA slots) and go to the first slot that frees. What a user
sees:

- every request is answered whole, in both body modes (BUFFERED asks Envoy to keep waiting past
  its 1 s message timeout); the queue metrics and `/debug/flow-control` show the waiting;
- a client that leaves while its request is queued takes it out of the queue: nothing is left
  counted as running or queued;
- a request whose TTL runs out gets a 503 with an OpenAI-shaped JSON error;
- SIGTERM sends what is still queued to its pods once the drain period is over: every client
  gets its whole response, none hangs.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import signal
import socket
import time
import urllib.request
from collections.abc import Iterator

import pytest
from prometheus_client.parser import text_string_to_metric_families

from epp.picker.extproc.stream import BodyMode
from epp.tools.loadgen import Answer
from epp.tools.localstack import LocalStack, SimOptions, StackOptions
from testkit.waiting import wait_until
from tests.integration.conftest import _started, models_yaml
from tests.integration.traffic import completion_request

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

ADAPTERS = tuple(f"adapter-{i}" for i in range(6))
# Each request runs ≈ 0.6 s (30 tokens at 20 ms), holding its pod's only slot meanwhile.
MAX_TOKENS = 30
SIM = SimOptions(
    adapters=ADAPTERS,
    max_loras=1,
    max_num_seqs=16,
    inter_token_latency_s=0.02,
    lora_load_latency_s=0.05,
    extra_args=("--max-model-len", "200000", "--kv-cache-tokens", "400000"),
)
STACK = StackOptions(pods=2, sim=SIM, extra_pool_yaml=models_yaml(("base", *ADAPTERS)))
CONCURRENT = 18  # three requests per adapter, all at once


def epp_get(stack: LocalStack, path: str) -> bytes:
    with urllib.request.urlopen(f"http://127.0.0.1:{stack.epp_metrics_port}{path}", timeout=10) as response:
        body: bytes = response.read()
    return body


def metric(stack: LocalStack, name: str, **labels: str) -> float:
    """The sum of the EPP's samples named `name` whose labels include `labels`."""
    text = epp_get(stack, "/metrics").decode()
    total = 0.0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                total += sample.value
    return total


def queued_now(stack: LocalStack) -> int:
    view = json.loads(epp_get(stack, "/debug/flow-control"))
    return int(view["queued"])


def burst(stack: LocalStack, count: int = CONCURRENT) -> list[concurrent.futures.Future[Answer]]:
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=count)
    futures = [
        pool.submit(completion_request, stack, ADAPTERS[i % len(ADAPTERS)], MAX_TOKENS, stream=i % 2 == 0)
        for i in range(count)
    ]
    pool.shutdown(wait=False)
    return futures


@pytest.fixture(
    scope="module", params=[BodyMode.FULL_DUPLEX_STREAMED, BodyMode.BUFFERED], ids=["fdx", "buffered"]
)
def stack(request: pytest.FixtureRequest) -> Iterator[LocalStack]:
    for started in _started(dataclasses.replace(STACK, body_mode=request.param)):
        yield warmed(started)


def warmed(stack: LocalStack) -> LocalStack:
    """`stack` once Envoy's access log reaches the EPP and every pod has reported its LoRA slots.

    Envoy opens the access-log stream with its first entry; until then the EPP cannot know when a
    request ends and lets each finish at routing, so nothing would hold a slot long enough to
    queue behind. vLLM publishes `max_lora` only once it has run a LoRA request; until then the
    EPP assumes the residency model's default and would let more adapters onto a pod than it has
    slots."""

    def logged() -> bool:
        assert completion_request(stack, ADAPTERS[0], 1, stream=False).status == 200
        return metric(stack, "inference_extension_request_finished_total", source="access-log") > 0

    def slots_reported() -> bool:
        for adapter in ADAPTERS:
            assert completion_request(stack, adapter, 1, stream=False).status == 200
        endpoints = json.loads(epp_get(stack, "/debug/flow-control"))["endpoints"]
        return len(endpoints) == STACK.pods and all(e["slots"] == SIM.max_loras for e in endpoints)

    wait_until(logged, "a request finished by its access-log entry", interval_s=0.2)
    wait_until(slots_reported, "every pod to report its LoRA slots", interval_s=0.2)
    return stack


def test_requests_wait_in_the_epp_for_a_slot_and_are_all_answered_whole(stack: LocalStack) -> None:
    dispatched_before = metric(
        stack, "inference_extension_flow_control_request_queue_duration_seconds_count", outcome="Dispatched"
    )
    futures = burst(stack)
    wait_until(lambda: queued_now(stack) > 0, "requests to wait in the EPP's queue", interval_s=0.02)
    assert metric(stack, "inference_extension_flow_control_queue_size") > 0
    results = [future.result(timeout=120) for future in futures]
    assert [(r.status, r.whole) for r in results] == [(200, True)] * CONCURRENT, [r.body for r in results]
    dispatched = (
        metric(
            stack,
            "inference_extension_flow_control_request_queue_duration_seconds_count",
            outcome="Dispatched",
        )
        - dispatched_before
    )
    assert dispatched > 0, "some requests went through the queue"
    waited = metric(
        stack, "inference_extension_flow_control_request_queue_duration_seconds_sum", outcome="Dispatched"
    )
    assert waited > 0
    wait_until(lambda: queued_now(stack) == 0, "the queue to empty")
    assert metric(stack, "inference_extension_flow_control_queue_size") == 0
    wait_until(
        lambda: metric(stack, "inference_objective_running_requests") == 0,
        "every request to finish",
        within_s=30,
    )


def _send_and_leave(stack: LocalStack, model: str) -> socket.socket:
    """Send a completion request and return its socket without reading the answer."""
    host, port = stack.gateway_url.removeprefix("http://").split(":")
    body = json.dumps({"model": model, "prompt": "Say hello.", "max_tokens": MAX_TOKENS}).encode()
    connection = socket.create_connection((host, int(port)), timeout=10)
    head = (
        f"POST /v1/completions HTTP/1.1\r\nHost: {host}\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\n\r\n"
    ).encode()
    connection.sendall(head + body)
    return connection


def test_clients_that_leave_while_queued_leave_nothing_behind(stack: LocalStack) -> None:
    cancelled_before = metric(
        stack,
        "inference_extension_flow_control_request_queue_duration_seconds_count",
        outcome="EvictedContextCancelled",
    )
    holders = burst(stack, 6)  # every slot busy for a while
    wait_until(lambda: queued_now(stack) >= 4, "requests to queue behind the busy slots", interval_s=0.02)
    before = queued_now(stack)
    # Adapters with nothing in flight: every one of these waits for a slot.
    leaving = [_send_and_leave(stack, ADAPTERS[2 + i % 4]) for i in range(4)]
    wait_until(lambda: queued_now(stack) > before, "the leaving clients' requests to queue", interval_s=0.02)
    for connection in leaving:
        connection.close()
    results = [future.result(timeout=120) for future in holders]
    assert [r.status for r in results] == [200] * 6
    wait_until(lambda: queued_now(stack) == 0, "the queue to empty")
    wait_until(
        lambda: metric(stack, "inference_objective_running_requests") == 0,
        "nothing counted as running",
        within_s=30,
    )
    assert metric(stack, "inference_extension_flow_control_queue_size") == 0
    cancelled = (
        metric(
            stack,
            "inference_extension_flow_control_request_queue_duration_seconds_count",
            outcome="EvictedContextCancelled",
        )
        - cancelled_before
    )
    assert cancelled >= 1, "a client that left while queued was counted as gone"


TTL_CONFIG = """\
apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
featureGates: [flowControl]
plugins:
- type: adapter-affinity-scorer
- type: lora-capacity-detector
saturationDetector: {pluginRef: lora-capacity-detector}
flowControl:
  defaultRequestTTL: 300ms
"""


@pytest.fixture
def short_ttl_stack() -> Iterator[LocalStack]:
    for started in _started(dataclasses.replace(STACK, extra_serve_args=("--config-text", TTL_CONFIG))):
        yield warmed(started)


def test_a_request_whose_ttl_runs_out_gets_a_clear_503(short_ttl_stack: LocalStack) -> None:
    results = [future.result(timeout=120) for future in burst(short_ttl_stack)]
    timed_out = [r for r in results if r.status == 503]
    assert timed_out, "with a 300 ms TTL and ≈ 0.6 s per slot, some requests time out in the queue"
    for result in timed_out:
        error = json.loads(result.body)["error"]
        assert error["code"] == 503
        assert "request timed out in queue" in error["message"]
    assert all(r.status in (200, 503) for r in results)
    assert all(r.whole for r in results if r.status == 200)


@pytest.fixture
def draining_stack() -> Iterator[LocalStack]:
    for started in _started(dataclasses.replace(STACK, drain_period="300ms")):
        yield warmed(started)


def test_sigterm_sends_the_queue_to_the_pods_and_no_client_hangs(draining_stack: LocalStack) -> None:
    stack = draining_stack
    futures = burst(stack, 24)
    wait_until(lambda: queued_now(stack) > 2, "requests to queue", interval_s=0.02)
    slot = stack.epp_slot
    assert slot is not None and slot.process is not None
    started = time.monotonic()
    slot.process.process.send_signal(signal.SIGTERM)
    results = [future.result(timeout=60) for future in futures]
    assert time.monotonic() - started < 30, "every client was answered promptly"
    assert slot.process.process.wait(timeout=30) == 0
    assert [(r.status, r.whole, r.body) for r in results] == [(200, True, b"")] * len(futures)
