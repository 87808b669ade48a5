"""Faults an EPP meets in production, each through the real processes.

- every pod's metrics stale (scrapes refused, or hanging until the scrape timeout): requests
  are still routed, and the EPP's own metrics show the failures;
- the EPP restarted while requests flow: FailOpen keeps serving, FailClose refuses cleanly,
  and both serve again once the EPP is back; no request hangs;
- shutdown (what SIGTERM triggers) lets an in-flight stream finish within the grace period;
- a pod killed mid-response: that request ends cut short without hanging, later ones avoid the pod.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import dataclasses
import http.client
import json
import pathlib
import socket
import threading
import time
import urllib.request
from collections.abc import Iterator

import grpc
import pytest
from prometheus_client.parser import text_string_to_metric_families

from epp._proto.envoy.config.core.v3 import base_pb2
from epp._proto.envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from epp._proto.envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc
from epp.picker.datastore.types import FailureMode
from epp.tools.localstack import LocalStack
from testkit import faults
from testkit.waiting import wait_until
from tests.integration.conftest import ADAPTERS, EPP_STACK, Reply, _started, completion
from tests.integration.test_serve_grpc import (
    BODY,
    FakePods,
    body_message,
    finish,
    headers_message,
    settings,
    start,
    write_pool,
)

pytestmark = pytest.mark.integration


def epp_metrics(stack: LocalStack) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    url = f"http://127.0.0.1:{stack.epp_metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


@pytest.fixture
def hung_metrics_port() -> Iterator[int]:
    """A port on every loopback address that accepts connections and never answers."""
    with socket.socket() as sock:
        sock.bind(("0.0.0.0", 0))
        sock.listen(64)
        yield sock.getsockname()[1]


def refused_port() -> int:
    with socket.socket() as sock:
        sock.bind(("0.0.0.0", 0))
        return int(sock.getsockname()[1])


@pytest.mark.parametrize("scrape", ["refused", "hung"])
def test_with_every_pod_stale_requests_are_still_routed(scrape: str, hung_metrics_port: int) -> None:
    port = hung_metrics_port if scrape == "hung" else refused_port()
    options = dataclasses.replace(EPP_STACK, extra_serve_args=("--model-server-metrics-port", str(port)))
    for stack in _started(options):
        replies = [completion(stack, adapter) for adapter in ADAPTERS]
        assert [r.status for r in replies] == [200] * len(ADAPTERS)
        # The scrape timeout is 5 s: wait (bounded) until every pod counts a failed scrape.
        deadline = time.monotonic() + 20
        while True:
            samples = epp_metrics(stack)
            failures = {
                dict(labels)["endpoint"]: value
                for (name, labels), value in samples.items()
                if name == "inference_extension_endpoint_scrape_consecutive_failures"
            }
            if len(failures) == len(stack.pods) and all(v > 0 for v in failures.values()):
                break
            assert time.monotonic() < deadline, failures
            time.sleep(0.2)
        ages = [
            v
            for (name, _), v in samples.items()
            if name == "inference_extension_endpoint_metrics_age_seconds"
        ]
        assert ages == [-1.0] * len(stack.pods)  # never a successful scrape
        assert completion(stack, ADAPTERS[0]).status == 200


RESTART = [
    dataclasses.replace(EPP_STACK, failure_mode=FailureMode.FAIL_OPEN),
    dataclasses.replace(EPP_STACK, failure_mode=FailureMode.FAIL_CLOSE),
]


@pytest.mark.parametrize("own_stack", RESTART, indirect=True, ids=["fail-open", "fail-close"])
def test_an_epp_restart_under_load(own_stack: LocalStack) -> None:
    stop = threading.Event()
    replies: list[tuple[float, Reply]] = []

    def load() -> None:
        index = 0
        while not stop.is_set() and index < 2000:
            reply = completion(own_stack, ADAPTERS[index % len(ADAPTERS)])
            replies.append((time.monotonic(), reply))
            index += 1

    def served_after(moment: float) -> list[float]:
        return [t for t, reply in list(replies) if t > moment and reply.status == 200]

    with concurrent.futures.ThreadPoolExecutor(max_workers=4) as pool:
        workers = [pool.submit(load) for _ in range(4)]
        try:
            wait_until(lambda: len(served_after(0.0)) >= 20, "the load is served before the restart")
            faults.restart_epp(own_stack)
            back_at = time.monotonic()
            # Load goes on until the new EPP has served a while: the first answer after the
            # restart and 100 more, whatever the machine's pace.
            wait_until(lambda: len(served_after(back_at)) > 100, "100 served after the restart", within_s=30)
        finally:
            stop.set()  # whatever failed, the workers stop now
        for worker in workers:
            worker.result(timeout=60)  # no request hung
    statuses = [r.status for _, r in replies]
    assert statuses.count(200) > 0
    assert all(s == 200 or 500 <= s < 600 for s in statuses), statuses
    if own_stack.options.failure_mode is FailureMode.FAIL_CLOSE:
        assert all(r.pod for _, r in replies if r.status == 200)
        assert not any(r.pod for _, r in replies if r.status != 200)  # refused before any pod
    # Envoy takes the dead EPP out at its first refused connection and routes through the new one
    # within about a second of its health check passing; from then on every request is served.
    after = [(t, r.status) for t, r in replies if t > back_at]
    first_ok = next(t for t, status in after if status == 200)
    assert first_ok < back_at + 2.0, after
    assert all(status == 200 for t, status in after if t > first_ok), after


async def test_shutdown_lets_an_in_flight_stream_finish(tmp_path: pathlib.Path) -> None:
    pods = FakePods()
    await pods.start()
    try:
        running = await start(settings(write_pool(tmp_path, pods.port), drain={"grace_period_s": 5.0}))
        try:
            await pods.wait_scraped()
            async with grpc.aio.insecure_channel(f"127.0.0.1:{running.ports.grpc}") as channel:
                call = pb_grpc.ExternalProcessorStub(channel).Process()
                await call.write(headers_message())
                await call.write(body_message(BODY, True))
                routed = [await call.read(), await call.read()]
                assert routed[0].HasField("request_headers")
                running.stop.set()  # what SIGTERM does
                await asyncio.sleep(0.3)
                status = base_pb2.HeaderValue(key=":status", raw_value=b"200")
                response = pb.ProcessingRequest(
                    response_headers=pb.HttpHeaders(
                        headers=base_pb2.HeaderMap(headers=[status]), end_of_stream=True
                    )
                )
                await call.write(response)
                reply = await asyncio.wait_for(call.read(), 5)
                assert reply.HasField("response_headers")
                await call.done_writing()
                assert await call.code() == grpc.StatusCode.OK
            await asyncio.wait_for(running.task, 20)
        finally:
            if not running.task.done():
                await finish(running)
    finally:
        await pods.stop()


SLOW_STREAM = dataclasses.replace(
    EPP_STACK, sim=dataclasses.replace(EPP_STACK.sim, inter_token_latency_s=0.05)
)


@pytest.mark.parametrize("own_stack", [SLOW_STREAM], indirect=True, ids=["slow-stream"])
def test_a_pod_dying_mid_response_fails_that_request_cleanly_and_later_ones_avoid_it(
    own_stack: LocalStack,
) -> None:
    host, port = own_stack.gateway_url.removeprefix("http://").split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=30)
    body = json.dumps({"model": ADAPTERS[0], "prompt": "Say hello.", "max_tokens": 200, "stream": True})
    connection.request("POST", "/v1/completions", body, {"content-type": "application/json"})
    response = connection.getresponse()
    assert response.status == 200
    serving = response.getheader("x-inference-pod")
    assert serving
    received = response.read1(64)  # the stream has started
    faults.kill_pod(own_stack, serving)
    started = time.monotonic()
    with contextlib.suppress(http.client.HTTPException, OSError):
        while chunk := response.read1(4096):
            received += chunk
    assert time.monotonic() - started < 20  # ended, did not hang
    assert b"[DONE]" not in received  # cut short, not completed by someone else
    connection.close()
    replies = [completion(own_stack, adapter) for adapter in ADAPTERS * 2]
    assert [r.status for r in replies] == [200] * len(replies)
    assert serving not in {r.pod for r in replies}
